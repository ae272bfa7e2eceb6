"""The README's demo: a prompt prefix computed by one process, reused by another.

This process creates a pool. A first, separate process runs a small Llama on
a 2048-token prompt (a "document" and a question) with nothing cached, and
stores the prompt's KV in the pool. A second process asks another question
about the same document: it loads the shared prefix from the pool, computes
only the rest, and checks that it generates the very tokens it would without
reuse. Both print their time to first token; then the pool's status is shown
and the pool destroyed (``--keep`` leaves it).

``--two-hosts`` plays two machines on this one: it starts a private
``redis-server`` on loopback, and each process gets a pool of its own (its own
name and ``KVCACHE_HOME``) whose remote tier is that server, in one namespace.
The first process's prefix goes to Redis as it is stored (write-through); the
second finds it there, fetches it in a few round trips, promotes it into its
own pool and generates the same tokens as without reuse.

The model has seeded random weights (nothing is downloaded), so both
processes build the same one, and the prompts are random token ids.

Run: ``python -m kvcache.demo [--two-hosts]`` (needs ``pip install
'kvcache[transformers]'``; ``--two-hosts`` also ``kvcache[redis]`` and
``redis-server`` on PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import kvcache

DOCUMENT_TOKENS, QUESTION_TOKENS, NEW_TOKENS = 1984, 64, 16
NAMESPACE = "kvcache-demo"


class FirstTokenClock:
    """A ``generate`` streamer that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.start, self.first, self._calls = time.perf_counter(), 0.0, 0

    def put(self, value: object) -> None:
        self._calls += 1
        if self._calls == 2:  # the first call passes the prompt
            self.first = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def ask(name: str, question: int) -> None:
    """One process: open the pool, generate an answer to ``question``, report."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from kvcache.integrations import transformers as kvhf
    except ImportError as exc:  # DependencyError (a wrong version) says what to install
        sys.exit(str(exc))

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
        num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=4096,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    document = torch.randint(
        0, 32000, (1, DOCUMENT_TOKENS), generator=torch.Generator().manual_seed(1)
    )
    asked = torch.randint(
        0, 32000, (1, QUESTION_TOKENS), generator=torch.Generator().manual_seed(question)
    )
    prompt = torch.cat([document, asked], dim=1)
    with kvcache.open(name) as pool, torch.inference_mode():
        model.generate(prompt[:, :8], max_new_tokens=2)  # warm up, as a serving process would be
        pc = kvhf.prefix_cache(pool, model, model_id="demo-llama", chunk_tokens=64)
        clock = FirstTokenClock()
        # kvhf.generate's three steps spelt out, to report the tokens loaded, not promised
        cache, reused = kvhf.load(pc, prompt)
        answer = model.generate(
            prompt,
            **{kvhf.CACHE_KEYWORD: cache},
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=NEW_TOKENS,
            streamer=clock,
        )
        kvhf.save(pc, answer[0], cache)
        source = "the pool"
        if pool.remote is not None:
            pool.remote.flush()  # what was written through is in Redis before this exits
            remote = pool.remote_stats()
            source = f"Redis ({remote.hits} chunks)" if remote and remote.hits else source
        print(
            f"[process {question - 1}, pid {os.getpid()}] {prompt.shape[1]}-token "
            f"prompt, {reused} tokens' KV from {source}: first token after {clock.first:.3f} s"
        )
        if reused:  # the same prompt without the pool, for comparison
            plain_clock = FirstTokenClock()
            plain = model.generate(prompt, max_new_tokens=NEW_TOKENS, streamer=plain_clock)
            print(
                f"    without reuse: first token after {plain_clock.first:.3f} s "
                f"({plain_clock.first / clock.first:.0f}x longer); the {NEW_TOKENS} new tokens "
                f"are {'the same' if torch.equal(plain, answer) else 'DIFFERENT'}"
            )


def main(argv: list[str] | None = None) -> None:
    """Create the pool(s), run two separate processes on them, show the status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="kvcache-demo")
    parser.add_argument("--keep", action="store_true", help="leave the pool for later use")
    parser.add_argument(
        "--two-hosts",
        action="store_true",
        help="two pools sharing prefixes through a private redis-server, as two machines would",
    )
    parser.add_argument("--question", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    needed = ("torch", "transformers", *(("redis",) if args.two_hosts else ()))
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        extras = "transformers,redis" if args.two_hosts else "transformers"
        sys.exit(f"the demo needs {' and '.join(missing)}: pip install 'kvcache[{extras}]'")
    if args.question is not None:
        ask(args.name, args.question)
        return
    if args.two_hosts:
        _two_hosts(args.name, args.keep)
        return
    _replace(args.name)
    kvcache.create(args.name, "1G").close()
    print(f"created pool '{args.name}' (1 GiB in /dev/shm); two processes will use it", flush=True)
    try:
        for question in (2, 3):
            _ask_in_a_process(args.name, question)
        _status(args.name)
    finally:
        if not args.keep and args.name in kvcache.list_pools():
            kvcache.destroy(args.name)


def _two_hosts(name: str, keep: bool) -> None:
    """Host A and host B: a pool and a KVCACHE_HOME each, one Redis between them."""
    hosts = {f"{name}-a": "host A", f"{name}-b": "host B"}
    with _private_redis() as url, tempfile.TemporaryDirectory(prefix="kvcache-demo-") as homes:
        for pool_name in hosts:
            _replace(pool_name)
            kvcache.create(
                pool_name, "1G", remote=url, namespace=NAMESPACE, write_through=True
            ).close()
        print(
            f"created pools {' and '.join(map(repr, hosts))} (1 GiB each in /dev/shm), "
            f"each with its own KVCACHE_HOME, sharing {url} (namespace {NAMESPACE!r})",
            flush=True,  # before the processes' own lines, also into a pipe
        )
        try:
            for question, (pool_name, host) in enumerate(hosts.items(), start=2):
                print(f"{host}:", flush=True)
                home = Path(homes) / host.replace(" ", "-")
                _ask_in_a_process(pool_name, question, KVCACHE_HOME=str(home))
            _status(f"{name}-b")
        finally:
            for pool_name in hosts:
                if not keep and pool_name in kvcache.list_pools():
                    kvcache.destroy(pool_name)


def _replace(name: str) -> None:
    """Destroy a pool left by an earlier demo run."""
    if name in kvcache.list_pools():
        kvcache.destroy(name)


def _ask_in_a_process(name: str, question: int, **env: str) -> None:
    command = [sys.executable, "-m", "kvcache.demo", "--name", name, "--question", str(question)]
    if subprocess.run(command, env={**os.environ, **env}).returncode:
        sys.exit(1)  # the process said why


def _status(name: str) -> None:
    from .cli import run

    run(["status", name])


@contextlib.contextmanager
def _private_redis() -> Iterator[str]:
    """A redis-server of this demo's own on a free loopback port, nothing persisted; its URL."""
    program = shutil.which("redis-server")
    if program is None:
        sys.exit(
            "--two-hosts needs redis-server on PATH (Debian/Ubuntu: apt-get install redis-server)"
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="kvcache-demo-redis-") as folder:
        server = subprocess.Popen(
            [program, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
             "no", "--dir", folder, "--logfile", str(Path(folder) / "redis.log")],
        )  # fmt: skip
        try:
            _wait_for_port(port, server)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.kill()
            server.wait()


def _wait_for_port(port: int, server: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"redis-server exited at start ({server.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    sys.exit(f"redis-server did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


if __name__ == "__main__":
    main()
