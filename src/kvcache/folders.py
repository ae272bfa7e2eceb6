"""Which folder a new pool's file goes in: its tier and path, checked.

    tier  path      folder
    ----  --------  ---------------------------------------------------------
    cpu   none      the shared-memory folder (/dev/shm, $KVCACHE_SHM_DIR)
    cpu   FOLDER    FOLDER, which must be in RAM (tmpfs, ramfs)
    disk  none      $KVCACHE_HOME/disk (made 0700 if missing)
    disk  FOLDER    FOLDER, which must be on a disk (not tmpfs or ramfs)

The tier and the folder must agree, and a disagreement is refused rather than
followed: a ``cpu`` pool on a disk would be slow and outlive reboots nobody
planned for, and a ``disk`` pool in RAM would take RAM that nothing reclaims
and lose its entries at the next reboot, while saying it keeps them. A given
folder must exist already (a typo should not create a tree somewhere), be a
folder and be writable; a relative path is taken from the current folder and
recorded as the absolute path it names (symbolic links resolved), so that every
process finds the pool whatever its own current folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import memory, registry, segment
from .errors import InvalidArgument
from .home import kvcache_home

TIERS = ("cpu", "disk")


def default_disk_folder() -> Path:
    """``$KVCACHE_HOME/disk``: where disk pools go when no folder is given."""
    return kvcache_home() / "disk"


def choose(tier: str, path: str | os.PathLike[str] | None) -> Path:
    """The folder for a new pool of ``tier`` (``cpu`` or ``disk``) at ``path`` (or the default).

    Raises:
        InvalidArgument: an unknown tier, a path that is not a writable folder,
            or a folder whose storage does not match the tier.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"unknown tier {tier!r}: choose one of {', '.join(TIERS)}")
    if path is None and tier == "cpu":
        return segment.shm_dir()  # as it always was, wherever $KVCACHE_SHM_DIR points
    if path is None:
        folder = default_disk_folder()
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(
                f"cannot create the default disk-pool folder {folder} ({exc.strerror}): "
                "give a folder with --path, or set $KVCACHE_HOME"
            ) from exc
    else:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise InvalidArgument(f"path must name a folder, not {path!r}")
        folder = Path(os.path.realpath(path))
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise InvalidArgument(f"{folder} {what}: give an existing folder for the pool (--path)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgument(
            f"{folder} is not writable by this user (or is mounted read-only): "
            "give a folder you can write (--path)"
        )
    kind = memory.filesystem_type(folder)
    in_ram = kind in memory.RAM_FILESYSTEMS
    if tier == "disk" and in_ram:
        raise InvalidArgument(
            f"{folder} is in RAM ({kind}), so a disk pool there would take RAM and lose its "
            "entries at reboot: give a folder on a disk, or use --tier cpu"
        )
    if tier == "cpu" and not in_ram:
        raise InvalidArgument(
            f"{folder} is on a disk ({kind}), not in RAM: use --tier disk for a pool there, "
            "or leave out --path for shared memory"
        )
    return folder


def for_restore(
    name: str, replace: bool, tier: str | None, path: str | os.PathLike[str] | None
) -> Path:
    """The folder a restore builds pool ``name`` in.

    Given neither ``tier`` nor ``path``: the folder of the registered pool it
    replaces (a disk pool stays where it was), else shared memory. Given a
    ``path`` alone, the tier its storage has; given a ``tier`` alone, its default.
    """
    if tier is None and path is None:
        kept = registry.lookup(name) if replace else None
        return segment.shm_dir() if kept is None else kept
    return choose(tier, path) if tier is not None else matching(path)  # type: ignore[arg-type]


def matching(path: str | os.PathLike[str]) -> Path:
    """``path`` checked as a pool folder of the tier its storage has (RAM: cpu, else disk)."""
    if not isinstance(path, (str, os.PathLike)):
        return choose("disk", path)  # refuses it, with the reason
    in_ram = memory.is_ram_backed(Path(os.path.realpath(path)))
    return choose("cpu" if in_ram else "disk", path)
