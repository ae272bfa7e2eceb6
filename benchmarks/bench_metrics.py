"""The cost of the operational counters and latency histograms on put and get.

Run from the repository root::

    .venv/bin/python benchmarks/bench_metrics.py            # 61 rounds, ~4 minutes
    .venv/bin/python benchmarks/bench_metrics.py --quick    # smoke variant (CI)

Method: one process, one warm pool per value size (4 KiB and 1 MiB), six variants of
``Pool``'s code swapped in and out of the class round by round (in a shuffled order),
each timed as the best of 3 batches of put, get and get_into over every key:

- ``no counting``: the methods of ``Pool`` and its ``Store`` that count, compiled from
  this tree's ``pool.py`` and ``engine/store.py`` with ``COUNTING_LINES`` taken out (the
  sampler's countdowns and their tests, the kept-back value bytes), sampling off;
- ``again``: the same, timed again, so that the table shows its own noise;
- ``latency off``: this tree with sampling off (counters, no timing);
- ``1 in 64``: this tree, one call in 64 of each op timed (the previous default);
- ``as shipped``: this tree, one call in ``DEFAULT_SAMPLE_EVERY`` of each op timed;
- ``every op``: every op timed (why the default samples).

The ratios are each variant's ops/s over ``no counting``'s in the same round, median over
rounds (1.000 = no cost; the goal is ``as shipped`` within 3%). Variants in separate
processes differ by up to 3% from process to process (memory layout), more than the
effect measured; swapping code within one process removes that. A last line times, alone
(best of 7), what a get or put does with sampling off (the inline countdown and adding to
the bytes kept back in the process) beside what adding to a counter word in the segment
would cost instead. It prints tables and exits 0 (it is not a test), or 1 if pool.py and
engine/store.py no longer have the lines it takes out.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import timeit
import types
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import kvcache.engine.store
import kvcache.pool
from bench_pool import (
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
from kvcache.counters import DEFAULT_SAMPLE_EVERY, Latency, M
from kvcache.pool import Pool

COUNTING_LINES = (
    "self._gets_left -= 1",
    "self._puts_left -= 1",
    "if not self._gets_left:",  # with the timed call on the next line
    "if not self._puts_left:",
    "self.bytes_in += self._eq[eid * ENTRY_WORDS + E.value_len]",
    "self.bytes_in += len(payload)",
    "self.bytes_out += value_len if count else 0",
)
"""The lines of ``kvcache/pool.py`` (the countdowns) and ``kvcache/engine/store.py`` (the
kept-back bytes) by which a get or put counts (the header's hit, miss and put words are
older than the metrics, and stay); one ending in ``:`` goes with the next."""
COUNTING_LINES_IN_SOURCE = 13
CASES = ((4 * KiB, 4096), (MiB, 32))
OPS = ("put", "get", "get_into")
COUNTING_CLASSES = ((kvcache.pool, "Pool"), (kvcache.engine.store, "Store"))
Methods = dict[tuple[type, str], Callable[..., object]]


def without_counting() -> Methods | None:
    """The methods of ``Pool`` and ``Store`` that count, compiled from their source with
    ``COUNTING_LINES`` taken out; None (and why, printed) if they no longer have them all."""
    methods: Methods = {}
    removed = 0
    for module, class_name in COUNTING_CLASSES:
        source = Path(module.__file__ or "")
        kept: list[str] = []
        changed: set[str] = set()
        method, skip_next = "", False
        for line in source.read_text().split("\n"):
            if line.startswith("    def "):
                method = line.split("(")[0].removeprefix("    def ")
            if skip_next or line.strip() in COUNTING_LINES:
                skip_next = not skip_next and line.endswith(":")
                removed += 1
                changed.add(method)
            else:
                kept.append(line)
        bare = types.ModuleType(f"{module.__name__}_without_counting")
        bare.__package__ = module.__package__
        exec(compile("\n".join(kept), str(source), "exec"), bare.__dict__)
        cls = getattr(module, class_name)
        methods.update(((cls, name), vars(getattr(bare, class_name))[name]) for name in changed)
    if removed != COUNTING_LINES_IN_SOURCE:
        print(
            f"pool.py and engine/store.py have {removed} of the {COUNTING_LINES_IN_SOURCE} "
            "counting lines this benchmark takes out: update COUNTING_LINES; no table"
        )
        return None
    return methods


def _install(methods: Methods, pool: Pool, every: int) -> None:
    """Give ``Pool`` and ``Store`` these methods, and ``pool`` a sampler timing one call in
    ``every`` of each op from now on (0: none), as ``Pool.__init__`` does."""
    for (cls, name), method in methods.items():
        setattr(cls, name, method)
    engine = pool._engine
    pool._read, pool._write = engine.read, engine.write  # bound once, as Pool.__init__ does
    pool._latency = Latency(every, engine.add_sample)
    pool._gets_left = pool._puts_left = pool._latency.every


def _batches(call: Callable[[], object], batch_s: float) -> int:
    """How many calls of ``call`` take about ``batch_s``."""
    call()
    start = time.perf_counter()
    call()
    return max(1, round(batch_s / max(time.perf_counter() - start, 1e-9)))


def side_by_side(
    size: int, count: int, bare: Methods, rounds: int, batch_s: float
) -> dict[str, dict[str, list[float]]]:
    """Per op and variant, ops/s of each round (this process, one warm pool)."""
    shipped = {(cls, name): vars(cls)[name] for cls, name in bare}
    variants = {
        "no counting": (bare, 0),
        "again": (bare, 0),
        "latency off": (shipped, 0),
        "1 in 64": (shipped, 64),
        "as shipped": (shipped, DEFAULT_SAMPLE_EVERY),
        "every op": (shipped, 1),
    }
    value, buffer = random_bytes(size), np.empty(size, np.uint8)
    keys = [f"key-{i:08d}" for i in range(count)]
    page = 64 * KiB
    with temp_pool(
        new_pool_name("metrics"), pool_size_for(size, count, page), page_size=page
    ) as pool:
        calls = {
            "put": _over_keys(pool, "put", keys, value),
            "get": _over_keys(pool, "get", keys),
            "get_into": _over_keys(pool, "get_into", keys, buffer),
        }
        calls["put"]()
        loops = {op: _batches(call, batch_s) for op, call in calls.items()}
        rates = {op: {label: [] for label in variants} for op in OPS}
        try:
            for round_number in range(rounds):
                order = list(variants.items())
                random.Random(round_number).shuffle(order)  # no variant always runs first
                for op, call in calls.items():
                    for label, (methods, every) in order:
                        _install(methods, pool, every)
                        call()
                        best = min(_timed(call, loops[op]) for _ in range(3))
                        rates[op][label].append(loops[op] * count / best)
        finally:
            _install(shipped, pool, DEFAULT_SAMPLE_EVERY)
        stats = pool.stats()
        if stats.evictions or stats.misses:
            raise RuntimeError(f"benchmark pool evicted or missed: {stats}")
    return rates


def _over_keys(pool: Pool, op: str, keys: list[str], *args: object) -> Callable[[], None]:
    """One call of ``op`` per key, as the class has it now (bound once per batch); results
    are dropped at once, as an application's would be."""

    def run() -> None:
        method = getattr(pool, op)
        for key in keys:
            method(key, *args)

    return run


def _timed(call: Callable[[], object], loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        call()
    return time.perf_counter() - start


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
        "held.left -= 1\nif not held.left:\n    pass",
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=61, help="rounds (default 61)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of short batches")
    args = parser.parse_args(argv)
    bare = without_counting()
    if bare is None:
        return 1  # CI runs it: a benchmark that no longer measures what it says fails
    rounds = 3 if args.quick else args.rounds
    rows: list[list[object]] = []
    labels: list[str] = []
    for size, count in CASES:
        rates = side_by_side(size, count, bare, rounds, 0.005 if args.quick else 0.02)
        for op in OPS:
            base = rates[op]["no counting"]
            labels = list(rates[op])
            ratios = [
                statistics.median(r / b for r, b in zip(rates[op][label], base, strict=True))
                for label in labels[1:]
            ]
            rows.append(
                [
                    fmt_size(size),
                    op,
                    fmt_int(statistics.median(base)),
                    *[f"{ratio:.3f}" for ratio in ratios],
                ]
            )
    print_table(
        f"Counters and latency histograms: ops/s, median of {rounds} rounds in one process",
        ["value", "operation", labels[0], *[f"{label}/none" for label in labels[1:]]],
        rows,
        [
            "put overwrites; get returns new bytes; get_into fills one buffer; ratios: "
            f"median of each round's; as shipped: one call in {DEFAULT_SAMPLE_EVERY} timed"
        ],
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
