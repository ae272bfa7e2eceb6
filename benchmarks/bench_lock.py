"""The pool lock: the lock word against flock, alone and under a 4 KiB get and put.

Run from the repository root (the compiled extensions built)::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_lock.py          # about 30 s
    PYTHONPATH=src .venv/bin/python benchmarks/bench_lock.py --quick  # smoke variant

Three ways to lock, each timed in a child process of its own, taking turns (and
going first in turn) within each repeat, on one ``lru`` pool of 1,000 4 KiB values:

- ``flock``: the thread lock and ``flock`` on the segment, as every process locked
  before the lock word (and as the pure-Python engine and observers still do): the
  child hides ``kvcache._poollock`` from the lock before it opens the pool;
- ``lock word``: the compiled engine's futex word, nobody locking with flock only;
- ``lock word + flock``: the same while a flock-only handle is attached (as a
  pure-Python process or an observer would be), so every hold takes both.

Each child times a lock and unlock round trip (``with pool._engine.lock: pass``),
a 4 KiB get hit and a 4 KiB put over a key through the Pool API. The table shows
the median time per operation and its ratio to ``flock`` in the same repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

import kvcache
from bench_pool import print_table
from kvcache import lock as lock_module
from kvcache import native

KEYS = 1000
VALUE = bytes(range(256)) * 16  # 4 KiB
WAYS = ("flock", "lock word", "lock word + flock")
OPS = ("lock + unlock", "get 4 KiB (hit)", "put 4 KiB (over a key)")


def _child(pool_name: str, way: str, count: int) -> None:
    """In a child: microseconds per operation of each of ``OPS``, one per line."""
    if way == "flock":
        lock_module._word = None  # as before the lock word: flock only
    pool = kvcache.open(pool_name)
    other = None
    if way == "lock word + flock":
        word, lock_module._word = lock_module._word, None
        other = kvcache.open(pool_name)  # a flock-only handle: counted in flock_users
        lock_module._word = word
    lock = pool._engine.lock
    keys = [f"key-{i}" for i in range(KEYS)]

    def hold(_: str) -> None:
        with lock:
            pass

    ways = {
        OPS[0]: hold,
        OPS[1]: pool.get,
        OPS[2]: lambda key: pool.put(key, VALUE),
    }
    for op in OPS:
        run = ways[op]
        began = time.perf_counter()
        for i in range(count):
            run(keys[i % KEYS])
        print(f"{op}\t{(time.perf_counter() - began) / count * 1e6}")
    if other is not None:
        other.close()
    pool.close()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations (smoke)")
    args = parser.parse_args()
    if native.poollock is None:
        sys.exit("kvcache._poollock is not built (or KVCACHE_PURE_PYTHON is set)")
    count, repeats = (10_000, 3) if args.quick else (50_000, 5)
    name = f"bench-lock-{uuid.uuid4().hex[:8]}"
    pool = kvcache.create(name, "64M", policy="lru")
    times: dict[str, dict[str, list[float]]] = {way: {} for way in WAYS}
    try:
        for i in range(KEYS):
            pool.put(f"key-{i}", VALUE)
        pool.close()
        order = list(WAYS)
        for _ in range(repeats):
            order = order[1:] + order[:1]  # each goes first in turn
            for way in order:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", name, way, str(count)],
                    env=os.environ,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                for line in out.splitlines():
                    op, us = line.split("\t")
                    times[way].setdefault(op, []).append(float(us))
    finally:
        kvcache.destroy(name)
    rows = []
    for op in OPS:
        base = times["flock"][op]
        row = [op]
        for way in WAYS:
            mine = times[way][op]
            ratio = statistics.median(m / b for m, b in zip(mine, base, strict=True))
            row.append(f"{statistics.median(mine):.2f} us ({ratio:.2f}x)")
        rows.append(tuple(row))
    print_table(
        f"The pool lock, per operation ({count} ops x {repeats} repeats; ratio to flock)",
        ("operation", *WAYS),
        rows,
    )


if __name__ == "__main__":
    main()
