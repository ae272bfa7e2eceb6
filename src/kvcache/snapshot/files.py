"""Where snapshots live, and writing them so that a crash never leaves half a file.

A snapshot is written to a hidden temporary file in the destination folder,
fsynced, renamed over the final name, and the folder is fsynced, so the final
name always holds either the previous complete snapshot or the new complete
one. Files are created 0600 and folders 0700. Only a regular file (or a
symbolic link: the link is replaced, its target left alone) is ever replaced:
a FIFO, device node, socket or folder at the destination is refused before
anything is written, since renaming over ``/dev/null`` or a pipe another
program reads would break that program. The writer holds a lease on
its temporary file until the rename (``kvcache.builds``), so the next persist
to the same path removes the temporary files of writers that were killed,
and never one that is still being written, from any PID namespace.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from .. import builds
from ..errors import SnapshotError
from ..home import kvcache_home
from ..safepath import UnsafePathError, check_folder

SUFFIX = ".kvsnap"


def snapshot_home() -> Path:
    """Where default snapshots go: the kvcache home (see :mod:`kvcache.home`)."""
    return kvcache_home()


def default_path(name: str) -> Path:
    """The default snapshot file of pool ``name``."""
    return snapshot_home() / f"{name}{SUFFIX}"


def write_atomically(path: Path, write: Callable[[int], None]) -> None:
    """Create ``path`` through a fsynced temporary file and a rename.

    Args:
        write: fills the file through the descriptor it is given.

    Raises:
        SnapshotError: ``path`` is not a regular file (nor a symbolic link), the
            folder cannot be created or written, lies where another user could
            change it (:mod:`kvcache.safepath`), or the disk is full; the
            previous file at ``path`` is untouched.
    """
    _refuse_special_file(path)
    folder = path.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SnapshotError(
            f"cannot create folder {folder} ({exc.strerror}): pick another --path"
        ) from exc
    try:  # another user's symlink on the way, or a folder they may swap files in
        check_folder(folder, "snapshot folder")
    except (UnsafePathError, OSError) as exc:
        raise SnapshotError(f"cannot persist to {path}: {exc}; pick another --path") from None
    _remove_abandoned_temps(path)
    temp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SnapshotError(
            f"cannot write in {folder} ({exc.strerror}): pick another --path"
        ) from exc
    try:
        try:
            builds.hold(fd)
            write(fd)
            os.fsync(fd)
            os.rename(temp, path)
        finally:
            os.close(fd)  # drops the lease: only after the rename, or a cleaner could strike first
    except OSError as exc:
        temp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise SnapshotError(
                f"no space left for the snapshot in {folder}: "
                "free disk space or pick another --path"
            ) from exc
        raise SnapshotError(f"cannot write snapshot {path} ({exc.strerror or exc})") from exc
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    builds.fsync_folder(folder)


_SPECIAL_FILES = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def _refuse_special_file(path: Path) -> None:
    """Raise unless ``path`` is absent, a regular file or a symbolic link."""
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except OSError:
        return  # absent, or unreachable: creating the folder or the file reports why
    if kind in _SPECIAL_FILES:
        raise SnapshotError(
            f"{path} is {_SPECIAL_FILES[kind]}, not a snapshot file: pick another --path "
            "(a persist replaces only regular files)"
        )


def _remove_abandoned_temps(path: Path) -> None:
    """Delete temporary files that persists of ``path`` killed mid-write left behind.

    Only files whose lease nobody holds go; a concurrent persist is left alone.
    """
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{12}}\.tmp\Z")
    builds.remove_abandoned(
        path.parent / name for name in os.listdir(path.parent) if pattern.match(name)
    )


def write_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of ``views`` at the current offset (writes may be partial)."""
    for view in views:
        while view.nbytes:
            view = view[os.write(fd, view) :]


def read_exactly(fd: int, views: list[memoryview], offset: int) -> bool:
    """Fill ``views`` from ``offset``; False if the file ends first."""
    for view in views:
        while view.nbytes:
            count = os.preadv(fd, [view], offset)
            if count == 0:
                return False
            view, offset = view[count:], offset + count
    return True
