"""What the machine can still give a pool, read before every reservation.

Pool memory is reserved with ``posix_fallocate`` (``segment``): all of it at
create with ``prealloc``, 8 MiB at a time as pages are first used, and page
by page as a restore fills its new pool. On tmpfs (``/dev/shm``) reserved
pages are RAM that nothing reclaims (short of swap), so a reservation larger
than what is free does not fail: the kernel's OOM killer ends some process,
and on an inference host that is the engine, the largest one. So a
reservation is first compared with every limit that applies to its folder
(:class:`Room`), and refused with :class:`NotEnoughMemoryError` if it would
leave less than a margin:

    folder on tmpfs or ramfs (tier "cpu")      folder on a disk (tier "disk")
    ---------------------------------------    ------------------------------
    MemAvailable (/proc/meminfo)               the filesystem's free space
    each memory cgroup from this process's     (pages go to the disk, and
      up to its hierarchy's root: limit        the page cache in front of
      - usage + file cache it can reclaim      them can be written back)
      (v2 memory.max/current; v1
      memory.limit_in_bytes/usage_in_bytes)
    the tmpfs's own free space (its size=)

A cgroup's usage counts the page cache its processes caused (model weights
read from disk, for one), which the kernel drops before it fails a charge, so
``active_file + inactive_file`` of its memory.stat is added back, as
MemAvailable does for the whole machine. tmpfs pages are not part of either
(they sit on the anonymous lists). ``memory.high`` (throttling, not OOM) and
swap are not counted. The cgroups read are those this process was in when
its ``Room`` was made (a segment makes its own at its first reservation).

Cost: reading the limits (/proc/meminfo, statvfs, a small file per cgroup
level and two more per level with a limit) took 150-220 us between the
copies of a filling pool here, against 2.5-3.4 ms for the 8 MiB
``fallocate`` it guards: 3.5-4% of the time to fill a fresh pool with 1 MiB
puts. So a ``Room`` reads them again only once it has let through 1/16 of
the room it last found (``RECHECK_SHARE``): rarely while there is plenty,
at every reservation near the end, where it matters. A refusal always comes
from a fresh reading.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .errors import NotEnoughMemoryError
from .units import format_size

MARGIN_BYTES = 1 << 30
"""Keep 1 GiB of RAM (or disk) free for everything else. The margin is not a
forecast of the other processes' growth, which no one can know; it keeps a
pool from being the reservation that pushes the machine into reclaim storms
and the OOM killer, and leaves room for the ordinary churn of an engine
(activations, allocator slack). Fixed rather than a share of RAM, so that a
1 TiB host does not lose tens of GiB to it."""
MARGIN_SHARE = 16
"""...but at most 1/16 of a small limit (a 2 GiB container keeps 128 MiB)."""
RECHECK_SHARE = 16
"""Reservations let through on one reading: 1/16 of the room it found. Even 16
processes growing pools at once cannot together take more than that room
before each reads again, and the margin stays."""
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
_UNLIMITED = 1 << 62
"""cgroup v1 says "no limit" with a huge number (PAGE_COUNTER_MAX pages)."""
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
_MEMINFO = re.compile(rb"^(MemTotal|MemAvailable): +(\d+) kB$", re.MULTILINE)
PROC = Path("/proc")


@dataclass(frozen=True)
class Limit:
    """One thing that bounds a reservation: what it is, what it has left, what it keeps."""

    source: str
    free_bytes: int
    margin_bytes: int

    @property
    def room_bytes(self) -> int:
        """What a reservation may take from it."""
        return max(0, self.free_bytes - self.margin_bytes)


def margin_for(total_bytes: int) -> int:
    """The bytes kept free of a resource of ``total_bytes`` (see ``MARGIN_BYTES``)."""
    return min(MARGIN_BYTES, total_bytes // MARGIN_SHARE)


def filesystem_type(folder: Path, *, proc: Path = PROC) -> str:
    """The type (``tmpfs``, ``ext4``...) of the mount that holds ``folder``.

    Read from ``/proc/self/mountinfo``: the mount whose mount point is the
    longest prefix of the folder's real path; of mounts stacked on one point,
    the last (topmost).
    """
    target = os.path.realpath(folder)
    best, best_type = "", "unknown"
    for mount in _mounts(proc):
        if _within(target, mount.point) and len(mount.point) >= len(best):
            best, best_type = mount.point, mount.fstype
    return best_type


def is_ram_backed(folder: Path, *, proc: Path = PROC) -> bool:
    """Whether files in ``folder`` live in RAM (tmpfs or ramfs) rather than on a disk."""
    return filesystem_type(folder, proc=proc) in RAM_FILESYSTEMS


class Room:
    """The limits on reserving memory for files in one folder, re-read as reservations add up.

    Not thread-safe: a segment's reservations happen under its pool lock.
    """

    def __init__(self, folder: Path, *, proc: Path = PROC) -> None:
        """Find out once what kind of folder it is and which cgroups bound this process.

        Args:
            proc: where procfs is mounted (tests point it at a made-up layout).
        """
        self.folder = folder
        self.ram_backed = is_ram_backed(folder, proc=proc)
        self._meminfo = proc / "meminfo"
        self._cgroups = _memory_cgroups(proc) if self.ram_backed else []
        self._credit_bytes = 0  # what may still be reserved on the last reading

    def limits(self) -> list[Limit]:
        """Every limit that applies now, in no particular order."""
        if not self.ram_backed:
            return [self._folder_limit(keep_margin=True)]
        found = [self._memavailable(), self._folder_limit(keep_margin=False)]
        found += [limit for cgroup in self._cgroups if (limit := cgroup.limit()) is not None]
        return found

    def require(self, num_bytes: int, what: str, advice: str) -> None:
        """Refuse a reservation of ``num_bytes`` that some limit cannot give.

        Args:
            what: who needs the memory, e.g. ``"pool 'x'"``.
            advice: what the user can do, ending the message.

        Raises:
            NotEnoughMemoryError: naming the tightest limit and what it has left.
        """
        if num_bytes <= self._credit_bytes:
            self._credit_bytes -= num_bytes
            return
        tightest = min(self.limits(), key=lambda limit: limit.room_bytes)
        if num_bytes <= tightest.room_bytes:
            self._credit_bytes = (tightest.room_bytes - num_bytes) // RECHECK_SHARE
            return
        kept = (
            f", less {format_size(tightest.margin_bytes)} kept free for other processes"
            if tightest.margin_bytes
            else ""
        )
        raise NotEnoughMemoryError(
            f"{what} needs {format_size(num_bytes)} more "
            f"{'memory' if self.ram_backed else 'disk space'} but only "
            f"{format_size(tightest.room_bytes)} is available ({tightest.source} "
            f"{format_size(tightest.free_bytes)}{kept}): {advice}"
        )

    def _memavailable(self) -> Limit:
        fields = dict(_MEMINFO.findall(_read(self._meminfo)))  # regex: 26 us vs 41 splitting lines
        return Limit(
            "MemAvailable",
            int(fields[b"MemAvailable"]) * 1024,
            margin_for(int(fields[b"MemTotal"]) * 1024),
        )

    def _folder_limit(self, *, keep_margin: bool) -> Limit:
        fs = os.statvfs(self.folder)
        if not fs.f_blocks:  # ramfs has no size: only RAM bounds it
            return Limit(f"free space of {self.folder}", _UNLIMITED, 0)
        total = fs.f_blocks * fs.f_frsize
        return Limit(
            f"free space of {self.folder}",
            fs.f_bavail * fs.f_frsize,
            margin_for(total) if keep_margin else 0,
        )


@dataclass(frozen=True)
class _Cgroup:
    """One memory cgroup folder and the names of its files in that cgroup version."""

    folder: Path
    limit_file: str
    usage_file: str
    file_cache_keys: tuple[str, str]

    def limit(self) -> Limit | None:
        """Its limit now, or None if it has none."""
        try:
            text = _read(self.folder / self.limit_file).strip()
            if text == b"max" or int(text) >= _UNLIMITED:
                return None
            usage = int(_read(self.folder / self.usage_file))
            stat = _stat_numbers(_read(self.folder / "memory.stat"))
        except (OSError, ValueError):
            return None  # the cgroup went away, or reads differently: not ours to judge
        limit = int(text)
        reclaimable = sum(stat.get(key, 0) for key in self.file_cache_keys)
        return Limit(
            f"cgroup {self.folder} {self.limit_file} {format_size(limit)}, free",
            max(0, limit - usage + reclaimable),
            margin_for(limit),
        )


_FILES = {
    "v2": ("memory.max", "memory.current", ("active_file", "inactive_file")),
    "v1": (
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        ("total_active_file", "total_inactive_file"),
    ),
}
"""limit, usage and (in memory.stat) file-cache names per cgroup version; v1's
``total_*`` count the subtree, as its usage does."""


def _memory_cgroups(proc: Path) -> list[_Cgroup]:
    """This process's memory cgroup and its parents, in v2 and v1 hierarchies alike.

    ``/proc/self/cgroup`` gives the path inside each hierarchy; mountinfo
    gives where that hierarchy (or a subtree of it, in a container) is mounted.
    The root cgroup (never limited) and levels without a limit file (a v2
    hierarchy without the memory controller) are left out.
    """
    paths: dict[str, str] = {}  # "v2" or "v1" -> this process's path in that hierarchy
    for line in _read(proc / "self" / "cgroup").decode().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    found: list[_Cgroup] = []
    for mount in _mounts(proc):
        version = {"cgroup2": "v2", "cgroup": "v1"}.get(mount.fstype, "")
        if version not in paths or (version == "v1" and "memory" not in mount.options):
            continue
        if not _within(paths[version], mount.root):
            continue  # this process sits outside the subtree mounted here
        limit_file, usage_file, cache_keys = _FILES[version]
        point = Path(mount.point)
        folder = point / paths.pop(version)[len(mount.root) :].lstrip("/")  # pop: read once
        for level in (folder, *folder.parents):
            if level == point and mount.root == "/":
                break  # the hierarchy's root cgroup: it has no limit to read
            if (level / limit_file).exists():
                found.append(_Cgroup(level, limit_file, usage_file, cache_keys))
            if level == point:
                break
    return found


class _Mount(NamedTuple):
    root: str  # the folder of the mounted filesystem that appears at ``point``
    point: str
    fstype: str
    options: list[str]  # the filesystem's own (for cgroup v1: its controllers)


def _mounts(proc: Path) -> list[_Mount]:
    """``/proc/self/mountinfo``, with its octal escapes (``\\040`` for a space) undone."""
    mounts = []
    for line in _read(proc / "self" / "mountinfo").decode().splitlines():
        before, _, after = line.partition(" - ")
        fields = [_OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), f) for f in before.split()]
        fstype, _, options = [*after.split(), "", "", ""][:3]
        mounts.append(_Mount(fields[3], fields[4], fstype, options.split(",")))
    return mounts


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both absolute, normalised)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _stat_numbers(text: bytes) -> dict[str, int]:
    """A cgroup's memory.stat (``name value`` lines) as {name: value}."""
    pairs = (line.split() for line in text.decode().splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}


def _read(path: Path) -> bytes:
    """A whole file through raw ``os`` calls (/proc/meminfo: 16 us, vs 25 us with ``open()``)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):  # procfs hands out a page or so per read
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
