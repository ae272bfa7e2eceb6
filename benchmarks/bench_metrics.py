"""The cost of the operational counters and latency histograms (issue 14) on put and get.

Run from the repository root::

    .venv/bin/python benchmarks/bench_metrics.py            # 9 interleaved rounds, ~5 minutes
    .venv/bin/python benchmarks/bench_metrics.py --quick    # smoke variant (CI)

Method: as ``bench_versions`` (``bench_pool.measure_pool_ops`` in a fresh child process per
variant, variants interleaved round by round in a shuffled order, median over rounds), for
4 KiB and 1 MiB values, five variants side by side in one run:

- ``no counting``: a copy of this tree with the lines by which get, get_into and put count
  taken out of ``Pool`` (``COUNTING_LINES``: the sampler's countdowns, its stop, the
  kept-back value bytes), counters off;
- ``again``: the same copy measured again, so that the table shows its own noise (on the
  2-core VM two identical trees differ by up to 3% in this table);
- ``latency off``: this tree with ``KVCACHE_LATENCY_SAMPLE=0`` (counters, no timing);
- ``default``: this tree as shipped (counters, one call in 64 of each op timed);
- ``every op``: ``KVCACHE_LATENCY_SAMPLE=1`` (every op timed: why the default samples).

The last columns are each variant's ops/s over ``no counting``'s (1.00 = no cost; the
goal is the default within 3%), as the median over rounds of each round's ratio.

On a shared machine that table moves by 10-20% from run to run for 1 MiB values
(memory bandwidth taken by others), more than the effect measured. So a second table
pairs the sampler settings in one process on one pool: each round times a short batch
of each op with the sampler off, as shipped and timing every op, back to back, and the
ratio to "off" is the median over rounds of the per-round ratios. A third line times,
in isolation (best of 7), what a get or put does even with sampling off (the inline
countdown and adding to the bytes kept back in the process) beside what adding to a
counter word in the segment would cost instead. It prints tables and exits 0 (it is
not a test), or 1 if pool.py no longer has the lines it takes out.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from bench_pool import (
    REPO,
    KiB,
    MiB,
    fmt_int,
    fmt_size,
    new_pool_name,
    pool_size_for,
    print_table,
    random_bytes,
    temp_pool,
)
from bench_versions import measure
from kvcache.counters import DEFAULT_SAMPLE_EVERY, Latency, M
from kvcache.pool import Pool

COUNTING_LINES = (
    "self._gets_left -= 1",
    "self._puts_left -= 1",
    "started = 0 if self._gets_left else self._start_timing(GET)",
    "started = 0 if self._puts_left else self._start_timing(PUT)",
    "if started:",  # with the stop on the next line
    "self._bytes_in += q[base + E.value_len]",
    "self._bytes_out += q[base + E.value_len]",
)
"""The lines of ``kvcache/pool.py`` by which a get or put counts (the header's hit, miss and
put words are older than the metrics, and stay)."""
COUNTING_LINES_IN_POOL = 14
CASES = ((4 * KiB, 4096), (MiB, 32))
VARIANTS = {
    "no counting": None,
    "again": None,
    "latency off": {"KVCACHE_LATENCY_SAMPLE": "0"},
    "default": {},
    "every op": {"KVCACHE_LATENCY_SAMPLE": "1"},
}
OPS = ("put", "get", "get_into")
SAMPLERS = {"off": 0, "default": DEFAULT_SAMPLE_EVERY, "every op": 1}


def paired_ratios(size: int, count: int, rounds: int, batch_s: float) -> dict[str, list[float]]:
    """Per op and sampler, the median over rounds of (ops/s with it) / (ops/s with it off),
    all in this process on one warm pool."""
    value, buffer = random_bytes(size), np.empty(size, np.uint8)
    keys = [f"key-{i:08d}" for i in range(count)]
    page = 64 * KiB
    with temp_pool(
        new_pool_name("metrics"), pool_size_for(size, count, page), page_size=page
    ) as pool:
        calls = {
            "put": lambda: [pool.put(k, value) for k in keys],
            "get": lambda: [pool.get(k) for k in keys],
            "get_into": lambda: [pool.get_into(k, buffer) for k in keys],
        }
        calls["put"]()
        loops = {op: _loops(call, batch_s) for op, call in calls.items()}
        ratios: dict[str, dict[str, list[float]]] = {
            op: {label: [] for label in SAMPLERS} for op in OPS
        }
        for _ in range(rounds):
            for op, call in calls.items():
                rates = {}
                for label, every in SAMPLERS.items():
                    _set_sampler(pool, every)
                    start = time.perf_counter()
                    for _ in range(loops[op]):
                        call()
                    rates[label] = loops[op] * count / (time.perf_counter() - start)
                for label in SAMPLERS:
                    ratios[op][label].append(rates[label] / rates["off"])
    return {op: [statistics.median(ratios[op][label]) for label in SAMPLERS] for op in OPS}


def _set_sampler(pool: Pool, every: int) -> None:
    """Time one call in ``every`` of each op from now on (0: none), as ``Pool.__init__`` does."""
    pool._latency = Latency(every, pool._add_sample)
    pool._gets_left = pool._puts_left = pool._latency.every


def _loops(call: Callable[[], object], batch_s: float) -> int:
    call()
    start = time.perf_counter()
    call()
    return max(1, round(batch_s / max(time.perf_counter() - start, 1e-9)))


class _Held:
    """Stands for the pool: a plain instance's attributes, as the pool's are."""

    def __init__(self) -> None:
        self.left = 1 << 62
        self.bytes_out = 0


def micro_costs_ns() -> tuple[float, float, float]:
    """Best-of-7 nanoseconds, each alone: the inline countdown with sampling off, adding
    to the bytes kept back in the process, and adding to a counter word in the segment."""
    held = _Held()
    words = memoryview(bytearray(4096)).cast("q")
    statements = (
        "held.left -= 1\nstarted = 0 if held.left else 1",
        "held.bytes_out += 4096",
        "words[M.bytes_out] += 4096",
    )
    n = 200_000
    scope = {"held": held, "words": words, "M": M}

    def best(statement: str) -> float:
        return min(timeit.repeat(statement, globals=scope, number=n, repeat=7)) / n

    empty = best("pass")
    countdown, kept_back, word = ((best(s) - empty) * 1e9 for s in statements)
    return countdown, kept_back, word


def without_counting(folder: Path) -> Path | None:
    """A copy of this tree's ``src`` in ``folder`` with ``COUNTING_LINES`` taken out of
    ``Pool``; None (and why, printed) if pool.py no longer has them all."""
    src = folder / "src"
    shutil.copytree(REPO / "src", src)
    pool_py = src / "kvcache" / "pool.py"
    lines = pool_py.read_text().split("\n")
    kept: list[str] = []
    removed = 0
    for line in lines:
        if kept and kept[-1].strip() == "if started:" and "self._latency.stop(" in line:
            kept.pop()
            removed += 2
        elif line.strip() in COUNTING_LINES and line.strip() != "if started:":
            removed += 1
        else:
            kept.append(line)
    if removed != COUNTING_LINES_IN_POOL:
        print(
            f"pool.py has {removed} of the {COUNTING_LINES_IN_POOL} counting lines this "
            "benchmark takes out: update COUNTING_LINES; no table"
        )
        return None
    pool_py.write_text("\n".join(kept))
    return src


def on_and_off(rounds: int, quick: bool) -> bool:
    """The first table: this tree without counting beside its sampler settings; False if
    the variant without counting could not be built."""
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        bare_src = without_counting(Path(tmp))
        if bare_src is None:
            return False
        for size, count in CASES:
            runs: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
            for round_number in range(rounds):
                order = list(VARIANTS.items())
                random.Random(round_number).shuffle(order)  # no variant always runs first
                for label, environ in order:
                    src = bare_src if environ is None else REPO / "src"
                    runs[label].append(measure(src, size, count, False, quick, environ))
            for op in OPS:
                medians = {label: statistics.median(r[op] for r in runs[label]) for label in runs}
                pairs = {
                    label: zip(runs[label], runs["no counting"], strict=True)
                    for label in list(VARIANTS)[1:]
                }
                ratios = {
                    label: statistics.median(r[op] / bare[op] for r, bare in rounds_of_pairs)
                    for label, rounds_of_pairs in pairs.items()
                }
                rows.append(
                    [
                        fmt_size(size),
                        op,
                        *[fmt_int(medians[label]) for label in VARIANTS],
                        *[f"{ratio:.3f}" for ratio in ratios.values()],
                    ]
                )
    print_table(
        f"Counters and latency histograms: ops/s, median of {rounds} interleaved rounds",
        [
            "value",
            "operation",
            *VARIANTS,
            *[f"{label}/none" for label in list(VARIANTS)[1:]],
        ],
        rows,
        [
            "put overwrites; get returns new bytes; get_into fills one buffer; "
            "ratios: median of each round's"
        ],
    )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--quick", action="store_true", help="one round of short repeats")
    args = parser.parse_args(argv)
    if not on_and_off(1 if args.quick else args.rounds, args.quick):
        return 1  # CI runs it: a benchmark that no longer measures what it says fails
    paired_rounds = 3 if args.quick else 21
    paired: list[list[object]] = []
    for size, count in CASES:
        medians = paired_ratios(size, count, paired_rounds, 0.01 if args.quick else 0.1)
        paired += [[fmt_size(size), op, *[f"{r:.3f}" for r in medians[op]]] for op in OPS]
    print_table(
        f"Paired in one process: ops/s over sampling off, median of {paired_rounds} rounds",
        ["value", "operation", *SAMPLERS],
        paired,
        [f"default: one call in {DEFAULT_SAMPLE_EVERY} of each op timed"],
    )
    countdown_ns, kept_back_ns, word_ns = micro_costs_ns()
    print(
        f"\nalone, best of 7: the countdown {countdown_ns:.0f} ns and the kept-back bytes "
        f"{kept_back_ns:.0f} ns (each get or put makes one of each); adding to a counter "
        f"word in the segment instead {word_ns:.0f} ns"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
