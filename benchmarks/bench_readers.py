"""Readers side by side: 4 KiB gets by one reader, two readers at once, a reader beside a writer.

Run from the repository root (the compiled extensions built)::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_readers.py          # about 40 s
    PYTHONPATH=src .venv/bin/python benchmarks/bench_readers.py --quick  # smoke variant
    PYTHONPATH=src .venv/bin/python benchmarks/bench_readers.py --policy prefix

Each reader and writer is a process of its own, started for the cell, told to go at
once and counting its operations for a fixed time. Two ways, taking turns (and going
first in turn) within each repeat, on one pool of 1,000 4 KiB values (``lru``, or the
``--policy`` named), with room for the writer's 1,000 more (nothing is evicted: every
get is a hit):

- ``locked``: every get takes the pool's lock (the compiled read without the lock is
  switched off in the child), as every get did before;
- ``unlocked``: the compiled engine as it ships: a hit is read without the lock and
  kept if the entry's generation did not change meanwhile (``kvcache._lookup``); a
  queue policy's hit (``s3fifo``, ``arc``, ``prefix``) then takes the lock for its
  lists alone.

Cells: one reader alone (gets/s); two readers at once (their sum, and its ratio to
one alone in the same repeat); one reader beside a writer that overwrites other keys
as fast as it can (the reader's gets/s, and its ratio to alone). Goals: two readers
>= 1.7x one, a reader beside a writer >= 70% of its rate alone (on 2 cores: each
process has a core of its own, when the machine is otherwise idle).
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
from kvcache import native

KEYS = 1000
VALUE = bytes(range(256)) * 16  # 4 KiB
WAYS = ("locked", "unlocked")
CELLS = ("1 reader", "2 readers", "reader + writer")


def _child(pool_name: str, role: str, way: str, seconds: float) -> None:
    """In a child: wait for "go" on stdin, then get (or put) for ``seconds``; print the count."""
    pool = kvcache.open(pool_name)
    if way == "locked":
        pool._engine._read_unlocked = None
    keys = [f"key-{i}" for i in range(KEYS)]
    others = [f"other-{i}" for i in range(KEYS)]
    get, put = pool.get, pool.put
    print("ready", flush=True)
    sys.stdin.readline()
    done, stop = 0, time.perf_counter() + seconds
    while time.perf_counter() < stop:
        for i in range(100):
            if role == "reader":
                get(keys[(done + i) % KEYS])
            else:
                put(others[(done + i) % KEYS], VALUE)
        done += 100
    print(done, flush=True)
    pool.close()


def _cell(name: str, way: str, roles: tuple[str, ...], seconds: float) -> list[float]:
    """Operations per second of each of ``roles``, run at once."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", name, role, way, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for role in roles
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    rates = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 60)
        if proc.returncode:
            raise RuntimeError(f"a {way} child failed ({proc.returncode})")
        rates.append(int(out.split()[-1]) / seconds)
    return rates


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter cells (smoke)")
    parser.add_argument("--policy", default="lru", help="the pool's policy (default: lru)")
    args = parser.parse_args()
    if native.Finder is None:
        sys.exit("kvcache._lookup is not built (or KVCACHE_PURE_PYTHON is set)")
    seconds, repeats = (0.5, 1) if args.quick else (2.0, 3)
    name = f"bench-readers-{uuid.uuid4().hex[:8]}"
    pool = kvcache.create(name, "256M", page_size="16K", policy=args.policy)  # never full
    # per way and cell, per repeat: (rate of the first reader, rate of the cell)
    seen: dict[str, dict[str, list[tuple[float, float]]]] = {
        w: {c: [] for c in CELLS} for w in WAYS
    }
    try:
        for i in range(KEYS):
            pool.put(f"key-{i}", VALUE)
        pool.close()
        order = list(WAYS)
        for _ in range(repeats):
            order = order[1:] + order[:1]  # each goes first in turn
            for way in order:
                alone = _cell(name, way, ("reader",), seconds)[0]
                both = sum(_cell(name, way, ("reader", "reader"), seconds))
                beside = _cell(name, way, ("reader", "writer"), seconds)[0]
                for cell, rate in zip(CELLS, (alone, both, beside), strict=True):
                    seen[way][cell].append((alone, rate))
        with kvcache.open(name) as after:  # the readers' keys stayed: every get was a hit
            if after.stats().evictions or after.stats().misses:
                raise RuntimeError(f"the pool evicted or missed: {after.stats()}")
    finally:
        kvcache.destroy(name)
    goals = {"1 reader": "", "2 readers": ">= 1.7x", "reader + writer": ">= 0.70x"}
    rows = []
    for cell in CELLS:
        row = [cell]
        for way in WAYS:
            pairs = seen[way][cell]
            rate = statistics.median(r for _, r in pairs)
            ratio = statistics.median(r / a for a, r in pairs)
            row.append(f"{rate / 1000:.0f}k/s" + ("" if cell == "1 reader" else f" ({ratio:.2f}x)"))
        rows.append((*row, goals[cell]))
    print_table(
        f"4 KiB gets per second, {args.policy} ({seconds} s cells x {repeats} repeats; ratio "
        f"to 1 reader of the same way and repeat; {os.cpu_count()} cores)",
        ("cell", *WAYS, "goal (unlocked)"),
        rows,
    )


if __name__ == "__main__":
    main()
