"""Benchmark: persist and restore of a pool against plain sequential file I/O.

Run from the repository root::

    .venv/bin/python benchmarks/bench_snapshot.py            # 1 GiB, 5 repeats (~2 minutes)
    .venv/bin/python benchmarks/bench_snapshot.py --quick    # 256 MiB, 1 repeat (< 30 s)
    .venv/bin/python benchmarks/bench_snapshot.py --dir /some/folder

It prints a table and always exits 0 (it is not a test). The goal from the
issue, persist and restore within 2x of plain I/O on the same filesystem, is
printed next to each ratio as PASS / MISS.

Method
------
* Data: a pool (64 KiB pages) holding ``--size`` of 1 MiB values (distinct
  slices of a random block) under short text keys. "Bytes" below are the
  snapshot's data bytes (keys + values); GB/s is 1e9 bytes per second.
* Same filesystem: the snapshot and the baseline file are written to the same
  folder (default: a new folder under /tmp); the table names the mount, its
  device and its filesystem type.
* Write baseline: one ``os.write`` of the same number of bytes from memory into
  a new file, then ``fsync``. Persist: ``kvcache.persist(pool, path)``, which writes a
  temporary file entry by entry, fsyncs it, renames it and fsyncs the folder.
  Old files are removed (untimed) before each write so neither overwrites.
* Read baseline: a sequential ``readinto`` of the baseline file into a freshly
  allocated buffer (so first-touch page faults are paid, as the restore pays
  them in the new /dev/shm segment). Restore: ``kvcache.restore`` into a new
  pool name, which creates the segment, verifies every entry's checksum and
  opens the pool; closing and destroying it afterwards is not timed.
* An extra row (info, no goal) reads the baseline file into a new /dev/shm
  file mapping instead, reserved with ``posix_fallocate`` as pool pages are:
  the memory a restore has to fill. Process memory gets transparent huge
  pages, /dev/shm (tmpfs, huge=never by default) takes a fault per 4 KiB page,
  so this row shows how much of the restore's time is the destination memory.
* Page cache: a file that was just written is read back from the page cache,
  not from the device, so the "warm" rows measure memory and checksum speed.
  The "cold" rows drop the page cache first (``sync`` and
  ``echo 1 > /proc/sys/vm/drop_caches``, which needs root; if that fails the
  cold rows are left out and the reason is printed). Dropping the cache does
  not touch /dev/shm, so the pool itself stays in memory.
* Each figure is the median of ``--repeats`` runs (min-max shown), after one
  untimed warm-up round; within a run the baseline and the kvcache operation
  alternate which goes first. The garbage collector is off while timing. On a
  shared machine single timings vary by several times (other processes' I/O);
  look at the medians.

Pools are named ``bench-snap-<pid>-...`` and destroyed, and the files and the
folder removed, in ``finally`` blocks (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

import kvcache

VALUE_BYTES = 1 << 20
PAGE_BYTES = 64 << 10
GOAL_RATIO = 2.0


def mount_of(folder: Path) -> str:
    """'<mount point> on <device> (<fs type>)' for the mount holding ``folder``."""
    target = str(folder.resolve())
    best = ("?", "", "?")
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            device, point, fstype = line.split()[:3]
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[1]):  # the deepest mount wins
                best = (device, point, fstype)
    return f"{best[1]} on {best[0]} ({best[2]})"


def drop_page_cache() -> str | None:
    """Write back and drop the page cache; return why not, or None."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("1\n")
    except OSError as exc:
        return f"cannot drop the page cache ({exc.strerror}; needs root)"
    return None


def timed(action: Callable[[], object]) -> tuple[float, object]:
    """Seconds ``action`` took, and what it returned (released by the caller, untimed)."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        result = action()
        return time.perf_counter() - started, result
    finally:
        gc.enable()


def write_baseline(path: Path, data: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        done = 0
        while done < len(data):  # one write() call, unless the kernel cuts it short
            done += os.write(fd, data[done:])
        os.fsync(fd)
    finally:
        os.close(fd)


def read_into(path: Path, target: memoryview) -> None:
    with open(path, "rb", buffering=0) as file:
        done = 0
        while done < len(target):
            count = file.readinto(target[done:])
            if not count:
                raise RuntimeError(f"{path} is shorter than {len(target)} bytes")
            done += count


def read_baseline(path: Path, nbytes: int) -> np.ndarray:
    """Read the file into fresh process memory (its pages are first touched here)."""
    buffer = np.empty(nbytes, np.uint8)
    read_into(path, memoryview(buffer))
    return buffer


class ShmBuffer:
    """A new /dev/shm file of ``nbytes``, reserved like a pool's pages, mapped."""

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.ftruncate(self.fd, nbytes)
        os.posix_fallocate(self.fd, 0, nbytes)
        self.map = mmap.mmap(self.fd, nbytes)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
        self.path.unlink()


def read_into_shm(path: Path, nbytes: int, shm_path: Path) -> ShmBuffer:
    """Read the file into a new /dev/shm mapping: the kind of memory a restore fills."""
    target = ShmBuffer(shm_path, nbytes)
    view = memoryview(target.map)
    try:
        read_into(path, view)
    finally:
        view.release()
    return target


def release(result: object) -> None:
    """Untimed clean-up of what a timed action returned."""
    if isinstance(result, kvcache.Pool):
        name = result.name
        result.close()
        kvcache.destroy(name)
    elif isinstance(result, ShmBuffer):
        result.close()


def run(args: argparse.Namespace) -> None:
    num_values = max(1, args.size_mib * (1 << 20) // VALUE_BYTES)
    prefix = f"bench-snap-{os.getpid()}"
    made_folder = args.dir is None
    folder = Path(tempfile.mkdtemp(prefix="kvsnap-bench-", dir="/tmp")) if made_folder else args.dir
    folder.mkdir(parents=True, exist_ok=True)
    snapshot, baseline = folder / f"{prefix}.kvsnap", folder / f"{prefix}.baseline"
    shm_file = Path("/dev/shm") / f"{prefix}.baseline"  # not a pool: no 'kvcache.' prefix
    pool: kvcache.Pool | None = None
    rows: dict[str, list[float]] = {}
    cold_note: str | None = None
    try:
        pages_per_value = -(-(VALUE_BYTES + 16) // PAGE_BYTES)
        pool = kvcache.create(
            f"{prefix}-src", num_values * pages_per_value * PAGE_BYTES, page_size=PAGE_BYTES
        )
        block = np.random.default_rng(0).bytes(16 << 20)
        source = memoryview(block + block[:VALUE_BYTES])
        for i in range(num_values):
            offset = (i * 7919 * 64) % (16 << 20)
            pool.put(f"value-{i:06d}", source[offset : offset + VALUE_BYTES])
        data = memoryview(np.frombuffer(block * -(-(num_values + 1) // 16), np.uint8))

        print(f"folder:      {folder}")
        print(f"filesystem:  {mount_of(folder)}")
        print(f"pool:        {num_values} values x {VALUE_BYTES >> 20} MiB, page size 64 KiB")
        kvcache.persist(pool, snapshot)  # untimed: learn the size, warm up the filesystem
        nbytes = kvcache.inspect_snapshot(snapshot).data_bytes
        cold = not args.no_drop_caches
        for repeat in range(-1, args.repeats):  # round -1 warms up and is not counted
            for path in (snapshot, baseline):
                path.unlink(missing_ok=True)
            pairs = [
                (
                    ("write", partial(write_baseline, baseline, data[:nbytes]), False),
                    ("persist", partial(kvcache.persist, pool, snapshot), False),
                ),
                # warm: both files were just written, so they come from the page cache
                (
                    ("read shm", partial(read_into_shm, baseline, nbytes, shm_file), False),
                    ("read", partial(read_baseline, baseline, nbytes), False),
                    ("restore", partial(kvcache.restore, f"{prefix}-w", snapshot), False),
                ),
            ]
            if cold and cold_note is None:
                cold_note = drop_page_cache()
            if cold and cold_note is None:
                pairs.append(
                    (
                        ("read cold", partial(read_baseline, baseline, nbytes), True),
                        ("restore cold", partial(kvcache.restore, f"{prefix}-c", snapshot), True),
                    )
                )
            for pair in pairs:
                for label, action, drop_first in pair if repeat % 2 else pair[::-1]:
                    if drop_first:
                        drop_page_cache()
                    seconds, result = timed(action)
                    release(result)
                    if repeat >= 0:
                        rows.setdefault(label, []).append(seconds)
            if repeat >= 0:
                print(f"  repeat {repeat + 1}/{args.repeats} done", flush=True)
        file_bytes = snapshot.stat().st_size
        print(f"data bytes:  {nbytes:,} (keys + values); snapshot file {file_bytes:,} bytes")
        print_table(rows, nbytes, args.repeats)
        if args.no_drop_caches:
            print("cold rows: left out (--no-drop-caches)")
        elif cold_note:
            print(f"cold rows: left out: {cold_note}")
    finally:
        if pool is not None:
            pool.close()
        for name in kvcache.list_pools():
            if name.startswith(prefix):
                kvcache.destroy(name)
        for path in (snapshot, baseline, shm_file):
            path.unlink(missing_ok=True)
        for leftover in folder.glob(f".{prefix}*.tmp"):
            leftover.unlink()
        if made_folder:
            shutil.rmtree(folder, ignore_errors=True)


def print_table(rows: dict[str, list[float]], nbytes: int, repeats: int) -> None:
    def line(label: str, key: str, baseline: str | None) -> None:
        if key not in rows:
            return
        seconds = statistics.median(rows[key])
        spread = f"{min(rows[key]):.2f}-{max(rows[key]):.2f}"
        text = f"{label:<42} {seconds:7.3f} s ({spread:>9}) {nbytes / seconds / 1e9:6.2f} GB/s"
        if baseline is not None and baseline in rows:
            ratio = seconds / statistics.median(rows[baseline])
            best = min(rows[key]) / min(rows[baseline])
            verdict = "PASS" if ratio <= GOAL_RATIO else "MISS"
            text += f"  {ratio:5.2f}x (best {best:4.2f}x; goal <= {GOAL_RATIO:.0f}x: {verdict})"
        print(text)

    print()
    print(f"median (min-max) of {repeats} run(s); ratios: of the medians (of the minima)")
    line("write: one write() + fsync (baseline)", "write", None)
    line("persist: temp, fsync, rename, dir fsync", "persist", "write")
    line("read: sequential, page cache (baseline)", "read", None)
    line("  read into a new /dev/shm mapping (info)", "read shm", None)
    line("restore: page cache", "restore", "read")
    line("read: sequential, cache dropped (baseline)", "read cold", None)
    line("restore: cache dropped", "restore cold", "read cold")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB, one repeat (< 30 s)")
    parser.add_argument("--size-mib", type=int, default=None, help="data to persist (1024)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure (5)")
    parser.add_argument("--dir", type=Path, default=None, help="folder (default: new, in /tmp)")
    parser.add_argument(
        "--no-drop-caches", action="store_true", help="skip the cold (cache dropped) rows"
    )
    args = parser.parse_args(argv)
    if args.size_mib is None:
        args.size_mib = 256 if args.quick else 1024
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    return args


def run_reporting(run: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> int:
    """Run a benchmark; an error is reported, never a failed build (exit status 0)."""
    try:
        run(args)
    except KeyboardInterrupt:
        print("interrupted; pools and files cleaned up", file=sys.stderr)
    except Exception as exc:  # a benchmark reports, it does not fail the build
        print(f"benchmark error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_reporting(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
