"""Benchmark: disk pools against raw file I/O, and what spilling and promoting cost.

Run from the repository root::

    .venv/bin/python benchmarks/bench_tiers.py            # 1 GiB per size, 3 rounds (~3 min)
    .venv/bin/python benchmarks/bench_tiers.py --quick    # 256 MiB, 1 round (< 30 s)
    .venv/bin/python benchmarks/bench_tiers.py --folder /var/cache/kvcache

It prints tables and always exits 0 (it is not a test). The goal from the
issue, disk-pool put and get at >= 70% of raw I/O of the same bytes in the same
folder, is printed next to each ratio as PASS / MISS.

Method
------
* Folder: ``--folder``, else a new folder under /tmp (or under the repository
  when /tmp is in RAM); it must be on a disk (``kvcache.segment.tier_of``).
  The table names its mount, device and file system. GB/s is 1e9 bytes/s of
  value bytes.
* (1) Disk pool vs raw I/O, 1 MiB and 16 MiB values, ``--size-mib`` of each
  (distinct slices of a seeded random block). Write baseline: ``os.write`` of
  each value in turn into a new file in the folder, then ``os.fsync``. Put: a
  new disk pool (64 KiB pages, space reserved as pages are first used, as by
  default) gets every value, then ``pool.flush()`` (msync + fsync): durable,
  like write + fsync. Then the file and the pool are closed (pages still
  mapped by a process are not dropped), ``os.sync()`` and ``echo 3 >
  /proc/sys/vm/drop_caches`` (needs root; otherwise the rows say "page cache
  not dropped"). Cold read baseline: ``readinto`` of each value in turn into one
  preallocated, touched buffer. Cold get: the pool is opened again and
  ``get_into`` fills the same kind of buffer with each value (a disk pool
  checks every value's xxh3 checksum as it serves it). Each round makes new
  files and pools; the order of baseline and pool alternates between rounds;
  figures are medians of ``--rounds`` (min-max shown), since the virtual disk
  is noisy.
* (2) A put into a full pool: a 64 MiB pool in RAM alone (each put evicts and
  drops), and the same pool with ``spill_to`` a 256 MiB pool in RAM or a
  256 MiB disk pool in the folder (each put spills: its victims are copied
  down, into the page cache for the disk pool, with no fsync, as a put there
  is). Values of 64 KiB and 1 MiB, new keys. Each chain is first filled with
  448 MiB (untimed), so that the lower pool is full too and each spill also
  makes room below: the steady state of a chain, not a lower pool still taking
  fresh pages. us per put, median of rounds of puts, configurations
  interleaved, each case on new pools.
  Then a put that needs no room (4 KiB and 64 KiB values overwriting keys in a
  256 MiB pool that never fills) alone and chained: a chained pool also takes
  the lower pool's lock once per put to remove the key below.
* (3) One 1 MiB value read from a cold disk: a 64 MiB pool in RAM spilling to
  a disk pool holds 256 MiB of 1 MiB values, most of them on disk; a 256 MiB
  raw file of the same values sits in the folder. Each round drops the page
  cache (everything closed first) before each of: ``os.preadv`` of 1 MiB at
  random offsets of the raw file (the floor); ``get`` from the disk pool opened
  alone (no chain: read and verified, nothing promoted); ``get`` through the
  reopened top pool of other values on the disk tier (each read, verified,
  copied up, spilling a victim down to make room, and removed below); then
  ``get`` of those same values again, now in RAM. Values in seeded random
  order; each read timed on its own; medians over all rounds.

The garbage collector is off while timing. Pools are named
``bench-tiers-<pid>-...`` and destroyed, and the files and the folder removed,
in ``finally`` blocks (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import kvcache
from bench_snapshot import mount_of, run_reporting  # mount_of: a folder's mount, device, fs
from kvcache import segment

MIB = 1 << 20
PAGE_BYTES = 64 << 10
GOAL_RATIO = 0.70
SEED = 0
BLOCK_BYTES = 64 * MIB  # random source; values are slices of it
LOWER_SIZE = "256M"  # lower pools of (2)
PROMOTE_VALUES = 256  # 1 MiB values in (3): 256 MiB, most of them on the disk tier
FILL_BYTES = 448 * MIB  # past full: the 64 MiB top pool and the 256 MiB lower pool
REPO = Path(__file__).resolve().parent.parent


def drop_page_cache() -> str | None:
    """Write dirty pages back and drop the page cache; return why not, or None.

    Pages that a process still maps are not dropped: close pools and mappings first.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
    except OSError as exc:
        return f"page cache not dropped ({exc.strerror}; needs root)"
    return None


def disk_folder(requested: Path | None, tag: str) -> tuple[Path, bool]:
    """The folder to measure in, and whether this run made it (and removes it)."""
    if requested is not None:
        requested.mkdir(parents=True, exist_ok=True)
        return requested, False
    parent = Path(tempfile.gettempdir())
    if segment.tier_of(parent) != "disk":
        parent = REPO
    return Path(tempfile.mkdtemp(prefix=f".{tag}-", dir=parent)), True


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` took, with the garbage collector off."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        action()
        return time.perf_counter() - started
    finally:
        gc.enable()


@contextmanager
def pools_named(prefix: str) -> Iterator[None]:
    """Destroy every pool whose name starts with ``prefix`` when the block ends."""
    try:
        yield
    finally:
        names = [n for n in kvcache.list_pools() if n.startswith(prefix)]
        for force in (False, True):  # upper pools first; then whatever is left
            for name in names:
                with suppress(kvcache.KVCacheError):
                    kvcache.destroy(name, force=force)


class Source:
    """Seeded random bytes; ``value(i, size)`` is a distinct slice of them."""

    def __init__(self) -> None:
        block = np.random.default_rng(SEED).bytes(BLOCK_BYTES)
        self.view = memoryview(block + block[: 16 * MIB])

    def value(self, i: int, size: int) -> memoryview:
        offset = (i * 7919 * 4096) % BLOCK_BYTES
        return self.view[offset : offset + size]


# ------------------------------------------------------------ (1) disk pool vs raw I/O


def raw_write(path: Path, values: Sequence[memoryview]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        for value in values:
            done = 0
            while done < len(value):
                done += os.write(fd, value[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path, count: int, buffer: memoryview) -> None:
    with open(path, "rb", buffering=0) as file:
        for _ in range(count):
            done = 0
            while done < len(buffer):
                got = file.readinto(buffer[done:])
                if not got:
                    raise RuntimeError(f"{path} is shorter than expected")
                done += got


def pool_put(pool: kvcache.Pool, values: Sequence[memoryview]) -> None:
    for i, value in enumerate(values):
        pool.put(f"v{i:06d}", value)
    pool.flush()


def pool_get(name: str, count: int, buffer: np.ndarray) -> None:
    pool = kvcache.open(name)
    try:
        for i in range(count):
            if pool.get_into(f"v{i:06d}", buffer) is None:
                raise RuntimeError(f"value {i} missing from the disk pool")
    finally:
        pool.close()


def disk_round(
    folder: Path, prefix: str, values: Sequence[memoryview], flip: bool
) -> tuple[dict[str, float], str | None]:
    """Seconds for write / put / cold read / cold get of ``values``, one round."""
    size, count = len(values[0]), len(values)
    raw_path = folder / f"{prefix}.raw"
    name = f"{prefix}-disk"
    buffer = np.ones(size, np.uint8)
    seconds: dict[str, float] = {}
    pool = kvcache.create(
        name, count * (size + 2 * PAGE_BYTES) + 16 * MIB, tier="disk", path=folder
    )
    try:
        writes = [
            ("write", lambda: raw_write(raw_path, values)),
            ("put", lambda: pool_put(pool, values)),
        ]
        for label, action in writes[::-1] if flip else writes:
            seconds[label] = timed(action)
        if pool.stats().evictions:
            raise RuntimeError("the disk pool evicted: it is sized too small")
        pool.close()
        note = drop_page_cache()  # after the close: a mapped page is not dropped
        reads = [
            ("read", lambda: raw_read(raw_path, count, memoryview(buffer))),
            ("get", lambda: pool_get(name, count, buffer)),
        ]
        for label, action in reads[::-1] if flip else reads:
            seconds[label] = timed(action)
            if note is None:
                drop_page_cache()  # the other one reads cold too
    finally:
        pool.close()
        kvcache.destroy(name)
        raw_path.unlink(missing_ok=True)
    return seconds, note


def section_disk(args: argparse.Namespace, folder: Path, prefix: str, source: Source) -> None:
    """Print table (1)."""
    print(f"\n(1) disk pool vs raw I/O in {folder}: median (min-max) of {args.rounds} round(s)")
    header = f"{'value':>6} {'operation':<44} {'seconds':>20} {'GB/s':>6} {'pool/raw':>9}"
    print(header)
    print("-" * len(header))
    notes: set[str] = set()
    for size in (MIB, 16 * MIB):
        count = max(1, args.size_mib * MIB // size)
        values = [source.value(i, size) for i in range(count)]
        runs: dict[str, list[float]] = {}
        for r in range(args.rounds):
            seconds, note = disk_round(folder, f"{prefix}-{size >> 20}m{r}", values, bool(r % 2))
            if note:
                notes.add(note)
            for label, value in seconds.items():
                runs.setdefault(label, []).append(value)
        nbytes = count * size
        cold = "page cache not dropped" if notes else "cold"
        rows = (
            ("write", "raw: os.write each value, fsync", None),
            ("put", "disk pool: put each value, flush()", "write"),
            ("read", f"raw: readinto each value ({cold})", None),
            ("get", f"disk pool: reopen, get_into each ({cold})", "read"),
        )
        for label, text, base in rows:
            median = statistics.median(runs[label])
            spread = f"{min(runs[label]):.3f}-{max(runs[label]):.3f}"
            line = f"{size >> 20:>4}Mi {text:<44} {median:7.3f} ({spread:>11}) "
            line += f"{nbytes / median / 1e9:6.2f}"
            if base is not None:
                ratio = statistics.median(runs[base]) / median
                best = min(runs[base]) / min(runs[label])
                line += f" {ratio:8.2f} (best {best:4.2f}) goal >= {GOAL_RATIO:.0%}: "
                line += "PASS" if ratio >= GOAL_RATIO else "MISS"
            print(line)
        print(f"       {count} values, {nbytes / 1e9:.2f} GB per operation")
    for note in sorted(notes):
        print(f"note: {note}")


# ------------------------------------------------------------ (2) spill vs drop


def put_batch(pool: kvcache.Pool, tag: str, source: Source, size: int, start: int, n: int) -> None:
    for i in range(start, start + n):
        pool.put(f"{tag}-{i:07d}", source.value(i, size))


SPILL_CASES = ((True, 64 << 10, 256), (True, MIB, 32), (False, 4096, 2048), (False, 64 << 10, 512))


def chain_pools(prefix: str, folder: Path, full: bool) -> list[kvcache.Pool]:
    """The three configurations of a case: alone, spilling to RAM, spilling to disk."""
    upper_size = "64M" if full else "256M"
    kvcache.create(f"{prefix}-low-cpu", LOWER_SIZE).close()
    kvcache.create(f"{prefix}-low-disk", LOWER_SIZE, tier="disk", path=folder).close()
    return [
        kvcache.create(f"{prefix}-{i}", upper_size, spill_to=below)
        for i, below in enumerate((None, f"{prefix}-low-cpu", f"{prefix}-low-disk"))
    ]


def section_spill(args: argparse.Namespace, folder: Path, prefix: str, source: Source) -> None:
    rounds = args.put_rounds
    print(f"\n(2) put cost, us per put: median of {rounds} rounds, configurations interleaved")
    header = f"{'case':<30} {'alone':>9} {'-> cpu':>9} {'-> disk':>9} "
    header += f"{'ratio cpu':>10} {'ratio disk':>10}"
    print(header)
    print("-" * len(header))
    for n, (full, size, batch) in enumerate(SPILL_CASES):
        batch = batch // 2 if args.quick else batch
        case_prefix = f"{prefix}-case{n}"
        with pools_named(case_prefix):
            pools = chain_pools(case_prefix, folder, full)
            # Full: fill the top pool and the lower one past full, so that every timed put
            # spills (or drops) and every spilled entry also makes room below: a chain in
            # its steady state, not one whose lower pool is still taking fresh pages.
            first = (FILL_BYTES if full else batch * size) // size
            for pool in pools:
                put_batch(pool, "k", source, size, 0, first)
            runs: list[list[float]] = [[] for _ in pools]
            nexts = [first if full else 0 for _ in pools]
            for r in range(rounds + 1):  # round 0 warms up
                order = list(range(len(pools)))
                for i in order[::-1] if r % 2 else order:
                    start = nexts[i]
                    seconds = timed(partial(put_batch, pools[i], "k", source, size, start, batch))
                    nexts[i] = start + batch if full else 0
                    if r:
                        runs[i].append(seconds / batch * 1e6)
            spilled = [p.stats().spills for p in pools]
            for pool in pools:
                pool.close()
        us = [statistics.median(r) for r in runs]
        case = f"{size >> 10} KiB, {'full pool (evicts)' if full else 'needs no room'}"
        print(
            f"{case:<30} {us[0]:9.1f} {us[1]:9.1f} {us[2]:9.1f} "
            f"{us[1] / us[0]:9.2f}x {us[2] / us[0]:9.2f}x"
        )
        if full and (spilled[0] or not all(spilled[1:])):
            print(f"  unexpected: spills per pool {spilled}")


# ------------------------------------------------------------ (3) promotion


def pread_into(fd: int, buffer: np.ndarray, offset: int) -> int:
    return os.preadv(fd, [buffer], offset)


def timed_each(get: Callable[[Any], object], keys: Sequence[Any], runs: list[float]) -> None:
    """Append the microseconds of each ``get(key)``; a miss is an error."""
    for key in keys:
        gc.disable()
        started = time.perf_counter()
        value = get(key)
        runs.append((time.perf_counter() - started) * 1e6)
        gc.enable()
        if value is None:
            raise RuntimeError(f"{key} missing")


def section_promote(args: argparse.Namespace, folder: Path, prefix: str, source: Source) -> None:
    lower, upper = f"{prefix}-pr-disk", f"{prefix}-pr-cpu"
    raw_path = folder / f"{prefix}.pread"
    raw_write(raw_path, [source.value(i, MIB) for i in range(PROMOTE_VALUES)])
    kvcache.create(lower, "1G", tier="disk", path=folder).close()
    pool = kvcache.create(upper, "64M", spill_to=lower)
    buffer = np.ones(MIB, np.uint8)
    fd = -1
    try:
        for i in range(PROMOTE_VALUES):
            pool.put(f"p{i:04d}", source.value(i, MIB))
        pool.close()
        below = kvcache.open(lower)
        on_disk = sorted(map(str, below.keys()))
        below.close()
        order = [on_disk[i] for i in np.random.default_rng(SEED).permutation(len(on_disk))]
        offsets = np.random.default_rng(SEED + 1).permutation(PROMOTE_VALUES) * MIB
        per_round = 8 if args.quick else 16
        runs: dict[str, list[float]] = {"pread": [], "direct": [], "promote": [], "ram": []}
        note = None
        for r in range(args.rounds):
            direct = order[2 * r * per_round : (2 * r + 1) * per_round]
            chained = order[(2 * r + 1) * per_round : (2 * r + 2) * per_round]
            note = drop_page_cache()  # nothing is mapped now: every pool is closed
            fd = os.open(raw_path, os.O_RDONLY | os.O_CLOEXEC)
            picks = [int(o) for o in offsets[r * per_round : (r + 1) * per_round]]
            timed_each(partial(pread_into, fd, buffer), picks, runs["pread"])
            os.close(fd)
            fd = -1
            drop_page_cache()
            below = kvcache.open(lower)  # alone: no chain, so nothing is promoted
            timed_each(below.get, direct, runs["direct"])
            below.close()
            drop_page_cache()
            pool = kvcache.open(upper)
            timed_each(pool.get, chained, runs["promote"])
            before = pool.stats().promotions
            timed_each(pool.get, chained, runs["ram"])  # now in RAM
            if pool.stats().promotions != before:
                print("  note: some second reads were promoted again (evicted meanwhile)")
            pool.close()
    finally:
        if fd >= 0:
            os.close(fd)
        pool.close()
        raw_path.unlink(missing_ok=True)
    state = note or "page cache dropped"
    ram = statistics.median(runs["ram"])
    count = len(runs["ram"])
    print(f"\n(3) one 1 MiB value, {state}: median us of {count} reads ({args.rounds} round(s))")
    rows = (
        ("pread", "raw: os.preadv at a random offset (cold)"),
        ("direct", "disk pool alone: get (cold, no promotion)"),
        ("promote", "top pool in RAM -> disk pool: get (cold, promoted)"),
        ("ram", "top pool in RAM: get of the promoted value"),
    )
    for label, text in rows:
        us = statistics.median(runs[label])
        print(f"{text:<52} {us:9.1f} us  {us / ram:6.1f}x RAM")


def run(args: argparse.Namespace) -> None:
    prefix = f"bench-tiers-{os.getpid()}"
    folder, made = disk_folder(args.folder, prefix)
    try:
        tier = segment.tier_of(folder)
        print(f"folder:     {folder}\nfilesystem: {mount_of(folder)} (tier {tier})")
        if tier != "disk":
            print(f"{folder} is in RAM, not on a disk: pass --folder on a disk file system")
            return
        print(f"load:       {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
        source = Source()
        with pools_named(prefix):
            section_disk(args, folder, prefix, source)
            section_spill(args, folder, prefix, source)
            section_promote(args, folder, prefix, source)
    finally:
        for leftover in folder.glob(f"{prefix}*"):
            leftover.unlink()
        if made:
            shutil.rmtree(folder, ignore_errors=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB, one round (< 30 s)")
    parser.add_argument("--size-mib", type=int, default=None, help="data per size in (1) (1024)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of (1) and (3) (3)")
    parser.add_argument("--put-rounds", type=int, default=None, help="rounds of (2) (7)")
    parser.add_argument("--folder", type=Path, default=None, help="a folder on a disk")
    args = parser.parse_args(argv)
    if args.size_mib is None:
        args.size_mib = 256 if args.quick else 1024
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.put_rounds is None:
        args.put_rounds = 3 if args.quick else 7
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return run_reporting(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
