"""Benchmark: llama-cpp-python time to first token, with kvcache's PoolCache and without.

Run from the repository root::

    .venv/bin/python benchmarks/bench_llama_cpp.py            # 8 layers, hidden 1024 (~4 min)
    .venv/bin/python benchmarks/bench_llama_cpp.py --quick    # 4 layers, hidden 512 (~20 s)

It prints a table and always exits 0 (it is not a test).

Method
------
* Model: a random-weight Llama written as GGUF by ``kvcache.integrations.gguf_model``
  (float32 weights, f16 KV): 8 layers, hidden 1024, 16 heads, 4 KV heads, MLP
  2816; ``--quick``: 4 layers, hidden 512, 8 heads, 2 KV heads, MLP 1408. One
  ``Llama`` (n_ctx 4096, n_batch 512, one thread), prompts of 2048 seeded random tokens.
* TTFT is from calling ``llm(prompt, max_tokens=1)`` on an emptied context
  (``llm.reset()``) to the first call of a logits processor, i.e. when the
  first token's logits are ready: the cache lookup, ``load_state``, the
  prefill of what the state does not cover. The state ``Llama`` saves after
  the call is not timed, and the caches are read-only while timing (a
  saved state would turn the next "new question" into a "same prompt").
* Caches, each holding the state of the full prompt before timing:
  - none: the whole prompt is computed;
  - PoolCache: ``kvcache.integrations.llama_cpp.PoolCache`` on a pool, the
    state stored by *another process* that ran the prompt;
  - LlamaRAMCache / LlamaDiskCache: llama-cpp-python's own, filled by this
    process (they are per process, or a diskcache folder), in a temp folder.
* Requests: *same prompt* (all but the last token come from the cache) and
  *new question* (the first 2048-64 tokens, then 64 new ones).
* lookup: the part of TTFT spent in the cache's ``__getitem__`` (finding the
  state and reading it back; ``load_state`` and the prefill come after).
* Each figure is the median of ``--repeats`` runs after one untimed warm-up.
  The generated first token must equal the uncached one (checked).

The pool is named ``bench-llama-<pid>`` and destroyed in a ``finally`` block.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import llama_cpp
    from llama_cpp.llama_cache import BaseLlamaCache, LlamaDiskCache, LlamaRAMCache

    from kvcache.integrations import llama_cpp as kvllama
    from kvcache.integrations.gguf_model import ModelShape, write_model
except ImportError as exc:
    sys.exit(
        f"bench_llama_cpp needs llama-cpp-python and gguf ({exc}): pip install 'kvcache[llama-cpp]'"
    )

import numpy as np

import kvcache

FULL = ModelShape(num_layers=8, hidden=1024, num_heads=16, num_kv_heads=4, ffn=2816)
QUICK = ModelShape(num_layers=4, hidden=512, num_heads=8, num_kv_heads=2, ffn=1408)
PROMPT_TOKENS, NEW_TOKENS, N_CTX = 2048, 64, 4096
CHUNK_TOKENS = 256
# One thread: the machine these figures come from is shared, and ggml's threads spin at a
# barrier after every operation, so with another process on the core a 64-token step took
# 2-25x its time from run to run; one thread gives the same figures every run.
LLAMA_OPTIONS = dict(
    n_ctx=N_CTX, n_batch=512, n_threads=1, n_threads_batch=1, seed=0, verbose=False
)
FILLED_BY = {"none": "-", "PoolCache": "other process"}


def new_llama(model_path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(model_path), **LLAMA_OPTIONS)


class ReadOnly(BaseLlamaCache):
    """A cache's lookups only, timed: what ``Llama`` saves while timing is dropped."""

    def __init__(self, inner: BaseLlamaCache) -> None:
        super().__init__(inner.capacity_bytes)
        self.inner = inner
        self.lookup_s = 0.0

    @property
    def cache_size(self) -> int:
        return self.inner.cache_size

    def __getitem__(self, key: Sequence[int]) -> Any:
        start = time.perf_counter()
        try:
            return self.inner[key]
        finally:
            self.lookup_s += time.perf_counter() - start

    def __contains__(self, key: Sequence[int]) -> bool:  # type: ignore[override]
        return key in self.inner

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        pass


def ttft(llm: llama_cpp.Llama, prompt: list[int]) -> tuple[float, int]:
    """Seconds from the call to the first token's logits, and that token (their argmax)."""
    stamps: list[tuple[float, int]] = []

    def stamp(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        stamps.append((time.perf_counter(), int(np.argmax(scores))))
        return scores

    processors = llama_cpp.LogitsProcessorList([stamp])
    llm.reset()
    with contextlib.redirect_stderr(io.StringIO()):  # LlamaDiskCache prints on every call
        start = time.perf_counter()
        llm.create_completion(prompt, max_tokens=1, temperature=0.0, logits_processor=processors)
    return stamps[0][0] - start, stamps[0][1]


def filled_state(llm: llama_cpp.Llama, prompt: list[int]) -> Any:
    """The state ``Llama`` saves after completing ``prompt`` (what a cache holds once filled)."""
    llm.set_cache(None)
    llm.reset()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    return llm.save_state()


def refill(cache: BaseLlamaCache, prompt: list[int], state: Any) -> None:
    """Put the prompt's state back (untimed): LlamaDiskCache pops a state when it is read."""
    with contextlib.redirect_stderr(io.StringIO()):  # LlamaDiskCache prints on every call
        if prompt not in cache:
            cache[prompt] = state


def interleaved(
    llm: llama_cpp.Llama,
    caches: dict[str, BaseLlamaCache | None],
    requests: dict[str, list[int]],
    state: Any,
    args: argparse.Namespace,
) -> dict[tuple[str, str], tuple[float, float]]:
    """Median TTFT and lookup time per (cache, request); the rounds go through every cache
    in turn, so that other load on the machine falls on all of them alike. Round 0 is a
    warm-up."""
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    first_tokens: dict[str, int] = {}
    for round_ in range(args.repeats + 1):
        for label, cache in caches.items():
            for request, tokens in requests.items():
                if cache is not None and label != "PoolCache":
                    refill(cache, requests["same"], state)
                timed = None if cache is None else ReadOnly(cache)
                llm.set_cache(timed)
                seconds, first = ttft(llm, tokens)
                if round_:
                    lookup_s = 0.0 if timed is None else timed.lookup_s
                    times.setdefault((label, request), []).append((seconds, lookup_s))
                expected = first_tokens.setdefault(request, first)  # "none" runs first
                if first != expected:
                    print(f"  ! {label} {request}: first token {first}, uncached {expected}")
    llm.set_cache(None)
    return {
        key: (statistics.median(t for t, _ in runs), statistics.median(s for _, s in runs))
        for key, runs in times.items()
    }


def fill_in_another_process(pool_name: str, model_path: Path, prompt_file: Path) -> None:
    code = (
        "import sys, numpy as np, kvcache, llama_cpp\n"
        "from kvcache.integrations import llama_cpp as kvllama\n"
        "pool_name, model_path, prompt_file = sys.argv[1:]\n"
        f"llm = llama_cpp.Llama(model_path=model_path, **{LLAMA_OPTIONS!r})\n"
        "pool = kvcache.open(pool_name)\n"
        f"llm.set_cache(kvllama.PoolCache(pool, llama=llm, chunk_tokens={CHUNK_TOKENS}))\n"
        "llm.create_completion(np.load(prompt_file).tolist(), max_tokens=1, temperature=0.0)\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, pool_name, str(model_path), str(prompt_file)], check=True
    )


def run(args: argparse.Namespace) -> None:
    shape = QUICK if args.quick else FULL
    folder = Path(tempfile.mkdtemp(prefix="bench-llama-"))
    name = f"bench-llama-{os.getpid()}"
    pool = kvcache.create(name, args.pool_size)
    try:
        started = time.perf_counter()
        model_path = write_model(folder / "model.gguf", shape)
        written = time.perf_counter() - started
        llm = new_llama(model_path)
        rng = np.random.default_rng(1)
        vocab = llm.n_vocab()
        prompt = [llm.token_bos(), *rng.integers(3, vocab, PROMPT_TOKENS - 1).tolist()]
        question = prompt[:-NEW_TOKENS] + rng.integers(3, vocab, NEW_TOKENS).tolist()
        prompt_file = folder / "prompt.npy"
        np.save(prompt_file, np.array(prompt))
        fill_in_another_process(name, model_path, prompt_file)
        caches: dict[str, BaseLlamaCache | None] = {
            "none": None,
            "PoolCache": kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK_TOKENS),
            "LlamaRAMCache": LlamaRAMCache(capacity_bytes=4 << 30),
            "LlamaDiskCache": LlamaDiskCache(
                cache_dir=str(folder / "disk"), capacity_bytes=4 << 30
            ),
        }
        print(
            f"model: random Llama, {shape.num_layers} layers, hidden {shape.hidden}, "
            f"{shape.num_heads} heads / {shape.num_kv_heads} KV heads, MLP {shape.ffn}, "
            f"vocabulary {vocab}, f32 weights ({kvcache.format_size(model_path.stat().st_size)}, "
            f"written in {written:.1f} s); prompt {PROMPT_TOKENS} tokens, n_ctx {N_CTX}; "
            f"llama-cpp-python {llama_cpp.__version__}; median of {args.repeats}"
        )
        header = (
            f"{'cache':<15} {'filled by':<14} {'same prompt':>12} {'lookup':>9} {'speedup':>7} "
            f"{'new question':>12} {'lookup':>9} {'speedup':>7}"
        )
        print(header)
        print("-" * len(header))
        state = filled_state(llm, prompt)
        for label in ("LlamaRAMCache", "LlamaDiskCache"):
            refill(caches[label], prompt, state)  # type: ignore[arg-type]
        times = interleaved(llm, caches, {"same": prompt, "question": question}, state, args)
        for label in caches:
            row = f"{label:<15} {FILLED_BY.get(label, 'this process'):<14}"
            for request in ("same", "question"):
                (seconds, lookup_s), baseline = times[label, request], times["none", request][0]
                speedup = baseline / seconds
                row += f" {seconds * 1e3:>9.1f} ms {lookup_s * 1e3:>6.1f} ms {speedup:>6.1f}x"
            print(row)
        stats = pool.stats()
        state_bytes = len(llm.save_state().llama_state)
        print(
            f"state: {kvcache.format_size(state_bytes)}; pool '{name}': {stats.num_entries} "
            f"entries (state records and prefix markers), "
            f"{kvcache.format_size(stats.used_bytes)} used"
        )
        llm.set_cache(None)
        llm.close()
    finally:
        pool.close()
        kvcache.destroy(name)
        shutil.rmtree(folder, ignore_errors=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model (< 60 s)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (--quick: 2)")
    parser.add_argument("--pool-size", default="1G")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    return args


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
