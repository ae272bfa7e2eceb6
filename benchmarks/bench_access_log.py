"""The cost of a pool's access log on PrefixCache requests: logging on beside logging off.

Run from the repository root::

    .venv/bin/python benchmarks/bench_access_log.py          # about a minute
    .venv/bin/python benchmarks/bench_access_log.py --quick  # smoke variant (CI)

Why: the access log (``kvcache.accesslog``) writes one line per ``retrieve``
and per ``store`` of every process using the pool; it must cost little
beside the copies those calls make. Pool ``get``/``put`` are not logged (and
read no log state), so their cost is unchanged by construction.

Method: two pools of one layout, one logging to a file in a temporary
folder, one not. A request is what a serving loop does: ``retrieve`` a
prompt, ``store`` it; half the prompts share a "system prompt" with the last
one, so some chunks are found and some written. Rounds alternate between the
two pools; the table shows each one's median time per request and their
ratio, for a tiny layout (many small chunks: the worst case for a per-call
cost) and a Llama-8B-like one (1 MiB chunks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import kvcache
from bench_pool import new_pool_name, print_table
from bench_snapshot import run_reporting
from kvcache import KVLayout, PrefixCache

LAYOUTS = {
    "tiny (2x1x4 fp16, 16-token chunks)": (KVLayout(2, 1, 4, "float16"), 16, 1),
    "8B-like (32x8x128 fp16, 16-token chunks)": (KVLayout(32, 8, 128, "float16"), 16, 10),
}
"""label: (layout, chunk tokens, fewer requests by this factor: 8B-like KV is 64 MiB a prompt)"""
TOKENS = 512


def requests(num: int, tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Prompts of ``tokens`` tokens; every other one shares its first half with the last."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 32000, tokens)]
    for i in range(1, num):
        fresh = rng.integers(0, 32000, tokens)
        if i % 2:
            fresh[: tokens // 2] = prompts[-1][: tokens // 2]
        prompts.append(fresh)
    return prompts


def time_requests(pc: PrefixCache, prompts: list[np.ndarray], kv: np.ndarray) -> float:
    """Seconds per request: retrieve, then store what was missing."""
    started = time.perf_counter()
    for tokens in prompts:
        pc.retrieve(tokens)
        pc.store(tokens, kv)
    return (time.perf_counter() - started) / len(prompts)


def run(args: argparse.Namespace) -> None:
    rounds, requests_per_round = (3, 40) if args.quick else (9, 200)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvcache-bench-log-") as folder:
        for label, (layout, chunk, fewer) in LAYOUTS.items():
            num, tokens = requests_per_round // fewer, TOKENS
            kv = np.ones((layout.num_layers, 2, layout.num_kv_heads, tokens, layout.head_dim))
            kv = kv.astype(layout.dtype)
            size = f"{max(64, 2 * num * tokens * layout.token_bytes >> 20)}M"  # no evictions
            log = Path(folder) / f"{len(rows)}.log"
            pools = {
                "off": kvcache.create(new_pool_name("log-off"), size),
                "on": kvcache.create(new_pool_name("log-on"), size, access_log=log),
            }
            times: dict[str, list[float]] = {"off": [], "on": []}
            try:
                caches = {
                    k: PrefixCache(p, "m", layout, chunk_tokens=chunk) for k, p in pools.items()
                }
                for r in range(rounds):
                    prompts = requests(num, tokens, seed=r)
                    for variant in ("off", "on") if r % 2 else ("on", "off"):
                        pools[variant].clear()
                        times[variant].append(time_requests(caches[variant], prompts, kv))
            finally:
                for pool in pools.values():
                    pool.close()
                    kvcache.destroy(pool.name)
            off, on = statistics.median(times["off"]), statistics.median(times["on"])
            lines = len(log.read_text().splitlines())
            rows.append(
                (label, f"{off * 1e6:,.0f} us", f"{on * 1e6:,.0f} us", f"{on / off:.3f}", lines)
            )
    print_table(
        f"Access log cost per request ({TOKENS}-token prompts, retrieve + store, "
        f"median of {rounds} rounds)",
        ("layout", "log off", "log on", "on/off", "lines written"),
        rows,
        ["pool get/put are not logged: their cost does not change"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (CI smoke run)")
    return run_reporting(run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
