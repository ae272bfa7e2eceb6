"""The README's demo: a prompt prefix computed by one process, reused by another.

This process creates a pool. A first, separate process runs a small Llama on
a 2048-token prompt (a "document" and a question) with nothing cached, and
stores the prompt's KV in the pool. A second process asks another question
about the same document: it loads the shared prefix from the pool, computes
only the rest, and checks that it generates the very tokens it would without
reuse. Both print their time to first token; then the pool's status is shown
and the pool destroyed (``--keep`` leaves it).

The model has seeded random weights (nothing is downloaded), so both
processes build the same one, and the prompts are random token ids.

Run: ``python -m kvcache.demo`` (needs ``pip install 'kvcache[transformers]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time

import kvcache

DOCUMENT_TOKENS, QUESTION_TOKENS, NEW_TOKENS = 1984, 64, 16


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
        reused = min(pc.lookup(prompt), prompt.shape[1] - 1)
        clock = FirstTokenClock()
        answer = kvhf.generate(model, pc, prompt, max_new_tokens=NEW_TOKENS, streamer=clock)
        print(
            f"[process {question - 1}, pid {os.getpid()}] {prompt.shape[1]}-token "
            f"prompt, {reused} tokens' KV from the pool: first token after {clock.first:.3f} s"
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
    """Create the pool, run two separate processes on it, show its status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="kvcache-demo")
    parser.add_argument("--keep", action="store_true", help="leave the pool for later use")
    parser.add_argument("--question", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"the demo needs {' and '.join(missing)}: pip install 'kvcache[transformers]'")
    if args.question is not None:
        ask(args.name, args.question)
        return
    if args.name in kvcache.list_pools():
        kvcache.destroy(args.name)
    kvcache.create(args.name, "1G").close()
    print(f"created pool '{args.name}' (1 GiB in /dev/shm); two processes will use it")
    try:
        for question in (2, 3):
            command = [sys.executable, "-m", "kvcache.demo", "--name", args.name]
            if subprocess.run([*command, "--question", str(question)]).returncode:
                sys.exit(1)  # the process said why
        from .cli import run

        run(["status", args.name])
    finally:
        if not args.keep and args.name in kvcache.list_pools():
            kvcache.destroy(args.name)


if __name__ == "__main__":
    main()
