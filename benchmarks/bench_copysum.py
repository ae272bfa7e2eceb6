"""The compiled parts: copy and checksum in one pass against two and the raw copy, and 4 KiB
gets and puts with the compiled engine against pure Python.

Run from the repository root::

    .venv/bin/python benchmarks/bench_copysum.py          # about 2-3 minutes
    .venv/bin/python benchmarks/bench_copysum.py --quick  # smoke variant (CI)

Why: a put sums a value (XXH3-64, the checksum every read can verify) and copies
it into the pool. Done as two passes, the caller's bytes come from memory twice;
in one pass each 64-byte stripe is copied as xxh3 sums it (``_native/sumcopy.h``); a
put's copy into the pool from 64 KiB up goes round the cache instead (non-temporal
stores after each 16 KiB stretch is summed: ``sum_and_stream``), which the last way
times.

Method: each value size copies through a working set larger than the CPU's last
cache (512 MiB; ``--quick`` 128 MiB), a fresh stretch of source and target per
value, as values reach a pool in use; a second table repeats one value in place
(source and target stay cached: the case a loop over one buffer measures). The
four ways take turns within each repeat and the table shows the median rate and
its ratio to the raw ``numpy.copyto`` of the same repeats.

The first table times 4 KiB operations on one pool per policy (``lru``, whose hits
are read without the lock, and ``prefix``, whose hits are copied without it and move
its lists under it; 1,000
keys, never full) from two child processes, one compiled and one with
``KVCACHE_PURE_PYTHON=1``, taking turns (and going first in turn) within each
repeat; it shows the median rate of each and the median of the per-repeat ratios.

The second shows what verifying a read costs (compiled): per value size, one pool
(64 KiB pages) holding 128 MiB of values (``--quick`` 32 MiB), read with ``get``
and ``get_into`` through two handles of this process, one opened with
``verify_reads=False`` and one with ``verify_reads=True``, taking turns within each
repeat; the cost is the median of the per-repeat ratios. By default a pool verifies
every read (``verify_reads=False`` opts out): this table is what that costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial

import numpy as np
import xxhash

import kvcache
from bench_pool import print_table
from kvcache import native

Copy = Callable[[np.ndarray, np.ndarray], object]


def _ways() -> dict[str, Copy]:
    if native.sum_and_copy is None:
        sys.exit("kvcache._copysum is not built (or KVCACHE_PURE_PYTHON is set): nothing to time")
    one_pass, streamed = native.sum_and_copy, native.sum_and_stream
    assert streamed is not None  # built with sum_and_copy
    return {
        "raw copy (numpy.copyto)": lambda source, target: np.copyto(target, source),
        "sum, then copy (xxhash)": lambda source, target: (
            xxhash.xxh3_64_intdigest(source),
            np.copyto(target, source),
        ),
        "sum and copy in one pass": lambda source, target: one_pass((), (source,), (target,)),
        "one pass, round the cache": lambda source, target: streamed((), (source,), (target,)),
    }


def _rates(size: int, working_set: int, repeats: int, in_place: bool) -> dict[str, list[float]]:
    """GB/s of each way per repeat, copying ``working_set`` bytes in values of ``size``."""
    count = working_set // size
    span = size if in_place else working_set
    source = np.random.default_rng(0).integers(0, 256, span, dtype=np.uint8)
    target = np.ones(span, np.uint8)  # touched: no page faults in the timed copies
    rates: dict[str, list[float]] = {name: [] for name in _ways()}
    for _ in range(repeats):
        for name, way in _ways().items():
            began = time.perf_counter()
            for i in range(count):
                at = 0 if in_place else i * size
                way(source[at : at + size], target[at : at + size])
            rates[name].append(count * size / (time.perf_counter() - began) / 1e9)
    return rates


def _table(title: str, sizes: list[int], working_set: int, repeats: int, in_place: bool) -> None:
    rows = []
    for size in sizes:
        rates = _rates(size, working_set, repeats, in_place)
        raw = rates["raw copy (numpy.copyto)"]
        for name, measured in rates.items():
            ratio = statistics.median(m / r for m, r in zip(measured, raw, strict=True))
            rows.append(
                (f"{size >> 10} KiB  {name}", f"{statistics.median(measured):.1f}", f"{ratio:.2f}")
            )
        rows.append(("", "", ""))
    print_table(title, ("value, way", "GB/s", "of raw"), rows[:-1])


SMALL_BYTES = 4 << 10
SMALL_KEYS = 1000
SMALL_OPS = ("get (hit)", "get (miss)", "put (over a key)")
SMALL_POLICIES = ("lru", "prefix")


def _small_rates(pool_name: str, count: int) -> None:
    """In a child: ops/s of each 4 KiB operation on the pool, printed one per line."""
    pool = kvcache.open(pool_name)
    keys = [f"key-{i}" for i in range(SMALL_KEYS)]
    value = bytes(range(256)) * (SMALL_BYTES // 256)
    ways = {
        "get (hit)": lambda key: pool.get(key),
        "get (miss)": lambda key: pool.get("absent-" + key),
        "put (over a key)": lambda key: pool.put(key, value),
    }
    for name in SMALL_OPS:
        way = ways[name]
        began = time.perf_counter()
        for i in range(count):
            way(keys[i % SMALL_KEYS])
        print(f"{name}\t{count / (time.perf_counter() - began)}")
    pool.close()


def _small_table(count: int, repeats: int) -> None:
    if native.Finder is None:
        print("\n(4 KiB operations: kvcache._lookup is not built; no compiled engine to time)")
        return
    rows = []
    for policy in SMALL_POLICIES:
        rates = _small_policy_rates(policy, count, repeats)
        for op in SMALL_OPS:
            fast, pure = rates["compiled"][op], rates["pure-python"][op]
            ratio = statistics.median(f / p for f, p in zip(fast, pure, strict=True))
            rows.append(
                (
                    f"{policy}: 4 KiB {op}",
                    f"{statistics.median(fast) / 1e3:.0f}k",
                    f"{statistics.median(pure) / 1e3:.0f}k",
                    f"{ratio:.2f}x",
                )
            )
    print_table(
        f"4 KiB operations, compiled engine against KVCACHE_PURE_PYTHON=1 "
        f"({count} ops x {repeats} repeats)",
        ("operation", "compiled ops/s", "pure ops/s", "compiled / pure"),
        rows,
    )


def _small_policy_rates(policy: str, count: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per engine and operation, the rate of each repeat on one pool of ``policy``."""
    name = f"bench-small-{uuid.uuid4().hex[:8]}"
    pool = kvcache.create(name, "64M", policy=policy)
    try:
        value = bytes(range(256)) * (SMALL_BYTES // 256)
        for i in range(SMALL_KEYS):
            pool.put(f"key-{i}", value)
        rates: dict[str, dict[str, list[float]]] = {"compiled": {}, "pure-python": {}}
        engines = [("compiled", "0"), ("pure-python", "1")]
        for _ in range(repeats):
            engines.reverse()  # each goes first in turn
            for engine, pure in engines:
                out = subprocess.run(
                    [sys.executable, __file__, "--small-worker", name, str(count)],
                    env={**os.environ, "KVCACHE_PURE_PYTHON": pure},
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                for line in out.splitlines():
                    op, rate = line.split("\t")
                    rates[engine].setdefault(op, []).append(float(rate))
    finally:
        pool.close()
        kvcache.destroy(name)
    return rates


VERIFY_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
VERIFY_OPS = ("get", "get_into")


def _verify_rates(
    size: int, set_bytes: int, moved_bytes: int, repeats: int
) -> dict[str, list[float]]:
    """Seconds per operation of each (operation, verified) pair per repeat, on one pool of
    ``set_bytes`` of values of ``size``, read through two handles: one opened with
    ``verify_reads=False``, one with ``verify_reads=True``, taking turns within each repeat."""
    count = max(2, set_bytes // size)
    ops = max(count, moved_bytes // size)
    name = f"bench-verify-{uuid.uuid4().hex[:8]}"
    page = 64 << 10  # the default page size: a 4 KiB value takes a page of its own
    entry_bytes = -(-(size + 16) // page) * page
    pool = kvcache.create(name, count * entry_bytes * 5 // 4 + (16 << 20), verify_reads=False)
    checked = kvcache.open(name, verify_reads=True)
    times: dict[str, list[float]] = {}
    try:
        value = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
        keys = [f"v{i}" for i in range(count)]
        for key in keys:
            pool.put(key, value)
        target = bytearray(size)
        handles = [("off", pool), ("on", checked)]
        for _ in range(repeats):
            handles.reverse()  # each goes first in turn
            for op in VERIFY_OPS:
                for verified, handle in handles:
                    read = handle.get if op == "get" else partial(handle.get_into, buffer=target)
                    began = time.perf_counter()
                    for i in range(ops):
                        if read(keys[i % count]) is None:
                            sys.exit(f"{op} of a {size}-byte value missed: nothing to time")
                    times.setdefault(f"{op} {verified}", []).append(
                        (time.perf_counter() - began) / ops
                    )
    finally:
        checked.close()
        pool.close()
        kvcache.destroy(name)
    return times


def _verify_table(set_bytes: int, moved_bytes: int, repeats: int) -> None:
    """What verifying every read costs per size: the same reads with and without it."""
    if native.Finder is None:
        print("\n(verified reads: kvcache._lookup is not built; no compiled engine to time)")
        return
    rows = []
    for size in VERIFY_SIZES:
        times = _verify_rates(size, set_bytes, moved_bytes, repeats)
        for op in VERIFY_OPS:
            off, on = times[f"{op} off"], times[f"{op} on"]
            cost = statistics.median(b / a - 1 for a, b in zip(off, on, strict=True))
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            rows.append(
                (
                    f"{label} {op}",
                    f"{statistics.median(off) * 1e6:.2f}",
                    f"{statistics.median(on) * 1e6:.2f}",
                    f"{cost * 100:+.1f}%",
                )
            )
    print_table(
        f"Verified reads, compiled engine: verify_reads off and on, taking turns "
        f"({set_bytes >> 20} MiB of values per size, {repeats} repeats)",
        ("value, read", "off (us)", "on (us)", "cost"),
        rows,
    )


def main() -> None:
    if sys.argv[1:2] == ["--small-worker"]:
        _small_rates(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller working set (CI smoke)")
    args = parser.parse_args()
    _small_table(*((10_000, 3) if args.quick else (100_000, 7)))
    _verify_table(*((32 << 20, 64 << 20, 3) if args.quick else (128 << 20, 512 << 20, 7)))
    working_set, repeats = (128 << 20, 3) if args.quick else (512 << 20, 7)
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20]
    _table(
        f"Values through a {working_set >> 20} MiB working set (from memory)",
        sizes,
        working_set,
        repeats,
        in_place=False,
    )
    _table("One value again and again (cached)", sizes, 64 << 20, repeats, in_place=True)


if __name__ == "__main__":
    main()
