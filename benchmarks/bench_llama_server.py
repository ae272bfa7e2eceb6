"""Benchmark: llama-server time to first token through the kvcache proxy, cold and warm.

Run from the repository root (llama-server from scripts/setup.sh --llama-cpp)::

    .venv/bin/python benchmarks/bench_llama_server.py            # 8 layers, hidden 1024
    .venv/bin/python benchmarks/bench_llama_server.py --quick    # 2 layers, hidden 256 (~30 s)

It prints a table and always exits 0 (it is not a test).

Method
------
* Model: the random-weight Llama of ``kvcache.integrations.gguf_model`` (float32
  weights, f16 KV): 8 layers, hidden 1024, 16 heads, 4 KV heads, MLP 2816, as
  ``bench_llama_cpp``; ``--quick``: 2 layers, hidden 256. llama-server with
  ``-c 4096 -np 1 -t 1 -tb 1``; prompts of 2048 seeded random token ids (sent as ids).
* TTFT: from sending ``/completion`` with ``n_predict: 1`` to its whole answer
  (the prefill, one sampled token, the proxy's work before it: tokens, lookup,
  restore). The proxy saves the slot after the answer, off the client's clock;
  the next request is sent once that save is done.
* Cases: *cold* (llama-server alone, fresh); *after a restart* (the proxy and its
  server stopped and started again, the prompt known to the pool); *second
  server* (another proxy and server on the same pool, the first still running);
  *disk pool, process restarted* (a disk-tier pool, the proxy that filled it
  stopped, a new one started). Warm requests are the known 2048 tokens plus 16
  new ones. Each warm figure is one request on a freshly started proxy; the
  median of ``--repeats`` is shown.
* Proxy overhead: one server with ``--slot-save-path``, requests of 256 fresh
  random tokens (nothing cached) sent straight to it and through a proxy
  (``--upstream``) in turn; medians of 2 x ``--overhead-requests``.
* Failed requests: any answer other than HTTP 200 (the goal is none).

Pools are named ``bench-llama-server-<pid>-*`` and destroyed in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    from kvcache.integrations.gguf_model import ModelShape, write_model
    from kvcache.integrations.llama_server.supervisor import find_server, free_port
except ImportError as exc:
    sys.exit(f"bench_llama_server needs gguf and aiohttp ({exc}): pip install 'kvcache[test]'")

import numpy as np

import kvcache

FULL = ModelShape(num_layers=8, hidden=1024, num_heads=16, num_kv_heads=4, ffn=2816)
QUICK = ModelShape(num_layers=2, hidden=256, num_heads=4, num_kv_heads=2, ffn=512)
PROMPT_TOKENS, NEW_TOKENS, OVERHEAD_TOKENS = 2048, 16, 256
SERVER_OPTIONS = ["-c", "4096", "-np", "1", "-t", "1", "-tb", "1", "--no-webui"]
# One thread, as bench_llama_cpp: ggml's threads spin at a barrier after every operation, and on a
# shared machine another process on the core made steps of the same size 2-100x slower.
FAILED: list[str] = []


def post(url: str, path: str, doc: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds to the whole answer, and the answer (a failed one is recorded)."""
    request = urllib.request.Request(url + path, json.dumps(doc).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            body = answer.read()
    except OSError as exc:
        FAILED.append(f"{path}: {exc}")
        return time.perf_counter() - start, {}
    return time.perf_counter() - start, json.loads(body)


def ttft(url: str, tokens: list[int]) -> tuple[float, int]:
    """Seconds to a one-token answer for ``tokens``, and its ``cache_n``."""
    seconds, answer = one_token(url, tokens)
    return seconds, int(answer.get("timings", {}).get("cache_n", -1))


def one_token(url: str, tokens: list[int]) -> tuple[float, dict[str, Any]]:
    doc = {"prompt": tokens, "n_predict": 1, "temperature": 0.0, "cache_prompt": True}
    return post(url, "/completion", doc)


def wait_until(url: str, path: str, ready: Any = None, timeout_s: float = 300) -> dict[str, Any]:
    """The JSON at ``url + path`` once it answers (and ``ready(doc)`` holds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as answer:
                doc = json.loads(answer.read())
            if ready is None or ready(doc):
                return doc  # type: ignore[no-any-return]
        except OSError:
            pass
        time.sleep(0.02)
    raise SystemExit(f"{url}{path} did not get ready in {timeout_s} s")


@contextmanager
def running(command: list[str], url: str, ready_path: str) -> Iterator[str]:
    """A child process (output discarded) until the block ends; its URL once ready."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(url, ready_path)
        yield url
    finally:
        process.terminate()
        process.wait(60)


def proxy(pool: str, model: Path, *options: str) -> Any:
    port = free_port()
    command = [sys.executable, "-m", "kvcache", "llama-server", "--pool", pool]
    command += ["--listen", f"127.0.0.1:{port}", *options]
    if "--upstream" not in options:
        command += ["--", "-m", str(model), *SERVER_OPTIONS]
    return running(command, f"http://127.0.0.1:{port}", "/kvcache/stats")


def server(model: Path, *options: str) -> Any:
    port = free_port()
    command = [find_server(None), "-m", str(model), *SERVER_OPTIONS, "--port", str(port)]
    return running([*command, *options], f"http://127.0.0.1:{port}", "/health")


def saved(url: str, count: int) -> None:
    """Wait for the proxy's ``count``-th slot save (the slot is busy until then)."""
    wait_until(url, "/kvcache/stats", lambda s: s["counts"].get("saved", 0) >= count)


def warm_case(pool: str, model: Path, prompt: list[int], repeats: int) -> list[float]:
    """TTFT of the prompt plus new tokens on proxies started after the pool knew it."""
    times = []
    for repeat in range(repeats):
        rng = np.random.default_rng(1000 + repeat)
        question = prompt + rng.integers(300, 400, NEW_TOKENS).tolist()
        with proxy(pool, model) as url:
            seconds, cache_n = ttft(url, question)
            assert cache_n >= PROMPT_TOKENS, f"not warm: cache_n {cache_n}"
            times.append(seconds)
            saved(url, 1)
    return times


def overhead(model: Path, pool: str, num_requests: int) -> tuple[float, float, float, float]:
    """Medians of uncached requests straight to a server and through a proxy: seconds in
    all, then seconds outside the server's own prompt and decode time (what the proxy
    adds shows there without the prefill's noise on a shared machine)."""
    straight, through, straight_out, through_out = [], [], [], []
    rng = np.random.default_rng(7)
    with (
        tempfile.TemporaryDirectory() as slots,
        server(model, "--slot-save-path", slots, "--cache-ram", "0") as url,
    ):
        os.chmod(slots, 0o700)
        with proxy(pool, model, "--upstream", url, "--slot-dir", slots) as proxy_url:
            for index in range(num_requests):
                for times, outside, target in (
                    (straight, straight_out, url),
                    (through, through_out, proxy_url),
                ):
                    tokens = [1, *rng.integers(300, 400, OVERHEAD_TOKENS).tolist()]
                    seconds, answer = one_token(target, tokens)
                    timings = answer.get("timings", {})
                    times.append(seconds)
                    server_ms = timings.get("prompt_ms", 0.0) + timings.get("predicted_ms", 0.0)
                    outside.append(seconds - 1e-3 * server_ms)
                saved(proxy_url, index + 1)
    medians = (statistics.median(t) for t in (straight, through, straight_out, through_out))
    return tuple(medians)  # type: ignore[return-value]


def run(args: argparse.Namespace) -> None:
    shape = QUICK if args.quick else FULL
    rng = np.random.default_rng(0)
    prompt = [1, *rng.integers(300, 400, PROMPT_TOKENS - 1).tolist()]
    base = f"bench-llama-server-{os.getpid()}"
    with tempfile.TemporaryDirectory() as folder:
        model = write_model(Path(folder) / "model.gguf", shape)
        ram = kvcache.create(f"{base}-ram", args.pool_size)
        disk = kvcache.create(f"{base}-disk", args.pool_size, tier="disk", path=folder)
        try:
            rows = measure(model, prompt, ram.name, disk.name, args)
            state_bytes = max((len(ram.get(k) or b"") for k in ram), default=0)
        finally:
            for pool in (ram, disk):
                pool.close()
                kvcache.destroy(pool.name)
    cold = rows[0][1]
    print(f"model: {shape.num_layers} layers, hidden {shape.hidden}; prompt {PROMPT_TOKENS} "
          f"tokens; one slot state {kvcache.format_size(state_bytes)}")  # fmt: skip
    print(f"{'case':<40} {'TTFT ms':>9} {'vs cold':>8}")
    for label, seconds in rows:
        print(f"{label:<40} {1e3 * seconds:>9.1f} {cold / seconds:>7.1f}x")
    print(f"requests failed: {len(FAILED)}" + (f" ({FAILED[0]})" if FAILED else ""))


def measure(
    model: Path, prompt: list[int], ram: str, disk: str, args: argparse.Namespace
) -> list[tuple[str, float]]:
    rows = []
    colds = []
    for _ in range(args.repeats):
        with server(model) as url:
            colds.append(ttft(url, prompt)[0])
    rows.append(("cold (llama-server alone)", statistics.median(colds)))
    with proxy(ram, model) as url:  # the pool learns the prompt
        rows.append(("cold through the proxy (pool empty)", ttft(url, prompt)[0]))
        saved(url, 1)
        with proxy(ram, model) as second:
            seconds, cache_n = ttft(second, prompt + [300] * NEW_TOKENS)
            assert cache_n >= PROMPT_TOKENS, f"not warm: cache_n {cache_n}"
            rows.append(("second server sharing the pool", seconds))
            saved(second, 1)
    warm = warm_case(ram, model, prompt, args.repeats)
    rows.append(("after a restart, through the proxy", statistics.median(warm)))
    with proxy(disk, model) as url:
        ttft(url, prompt)
        saved(url, 1)
    rows.append(("disk pool, process restarted", statistics.median(
        warm_case(disk, model, prompt, args.repeats))))  # fmt: skip
    straight, through, straight_out, through_out = overhead(model, ram, args.overhead_requests)
    added_ms = 1e3 * (through_out - straight_out)
    print(f"proxy overhead, {OVERHEAD_TOKENS} uncached tokens: straight {1e3 * straight:.1f} ms, "
          f"through the proxy {1e3 * through:.1f} ms ({100 * (through / straight - 1):+.1f}%); "
          f"outside the server's compute: {1e3 * straight_out:.1f} ms straight, "
          f"{1e3 * through_out:.1f} ms through (+{added_ms:.1f} ms)")  # fmt: skip
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model (about 30 s)")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--overhead-requests", type=int, default=None, help="default 20 (5)")
    parser.add_argument("--pool-size", default="1G")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.overhead_requests is None:
        args.overhead_requests = 5 if args.quick else 20
    return args


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
