"""The README's demo: one pool, two processes, real reuse.

A writer process creates a pool and stores per-layer K/V arrays for a few
"prompts" (random numbers shaped like a small model's KV cache), then exits.
A second, separate process opens the pool by name, reads every array back,
verifies it bit for bit, and prints timings and the pool's stats. Finally the
pool is destroyed (pass ``--keep`` to leave it for ``kvcache.open``).

Run: ``python -m kvcache.demo``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

import kvcache

LAYERS, KV_HEADS, HEAD_DIM, TOKENS = 8, 4, 64, 512
PROMPTS = 16


def kv_for(prompt: int) -> np.ndarray:
    """Deterministic stand-in KV for one prompt: (layers, 2, kv_heads, tokens, head_dim)."""
    rng = np.random.default_rng(prompt)
    return rng.standard_normal((LAYERS, 2, KV_HEADS, TOKENS, HEAD_DIM), dtype=np.float32).astype(
        np.float16
    )


def write(name: str) -> None:
    """First process: create the pool and store every prompt's KV."""
    pool = kvcache.create(name, "256M", policy="lru")
    arrays = [kv_for(prompt) for prompt in range(PROMPTS)]
    start = time.perf_counter()
    for prompt, kv in enumerate(arrays):
        pool.put(f"prompt-{prompt}", kv)
    elapsed = time.perf_counter() - start
    stored = PROMPTS * kv_for(0).nbytes
    print(
        f"[writer pid {pool.stats().attached[0]}] stored {PROMPTS} prompts' KV "
        f"({kvcache.format_size(stored)}) in {elapsed * 1e3:.1f} ms, then exits"
    )
    pool.close()


def read(name: str) -> None:
    """Second process: open the pool by name, read back and verify everything."""
    with kvcache.open(name) as pool:
        start = time.perf_counter()
        arrays = [pool.get(f"prompt-{prompt}") for prompt in range(PROMPTS)]
        elapsed = time.perf_counter() - start
        verified = sum(a is not None and np.array_equal(a, kv_for(p)) for p, a in enumerate(arrays))
        recompute_start = time.perf_counter()
        for prompt in range(PROMPTS):
            kv_for(prompt)
        recompute = time.perf_counter() - recompute_start
        stats = pool.stats()
        print(
            f"[reader pid {stats.attached[-1]}] read back {verified}/{PROMPTS} prompts, "
            f"bit-exact, in {elapsed * 1e3:.1f} ms (regenerating: {recompute * 1e3:.1f} ms)"
        )
        print(
            f"pool '{name}': {stats.num_entries} entries, {kvcache.format_size(stats.used_bytes)} "
            f"used of {kvcache.format_size(stats.size_bytes)}, hits {stats.hits}, misses "
            f"{stats.misses}, hit rate {stats.hit_rate:.0%}, policy {stats.policy}"
        )
        if verified != PROMPTS:
            raise SystemExit("demo failed: data did not survive the process boundary")


def main(argv: list[str] | None = None) -> None:
    """Run writer and reader as two separate Python processes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="kvcache-demo")
    parser.add_argument("--keep", action="store_true", help="leave the pool for later use")
    parser.add_argument("--role", choices=["write", "read"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        (write if args.role == "write" else read)(args.name)
        return
    if args.name in kvcache.list_pools():
        kvcache.destroy(args.name)
    try:
        for role in ("write", "read"):
            subprocess.run(
                [sys.executable, "-m", "kvcache.demo", "--name", args.name, "--role", role],
                check=True,
            )
    finally:
        if not args.keep and args.name in kvcache.list_pools():
            kvcache.destroy(args.name)


if __name__ == "__main__":
    main()
