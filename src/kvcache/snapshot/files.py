"""Where snapshots live, and writing them so that a crash never leaves half a file.

A snapshot is written to a hidden temporary file in the destination folder,
fsynced, renamed over the final name, and the folder is fsynced, so the final
name always holds either the previous complete snapshot or the new complete
one. Files are created 0600 and folders 0700. A temporary file left by a
persist that was killed is removed by the next persist to the same path.
"""

from __future__ import annotations

import errno
import glob
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from ..errors import SnapshotError
from ..procs import me

SUFFIX = ".kvsnap"


def snapshot_home() -> Path:
    """``$KVCACHE_HOME``, else ``$XDG_DATA_HOME/kvcache``, else ``~/.local/share/kvcache``."""
    if os.environ.get("KVCACHE_HOME"):
        return Path(os.environ["KVCACHE_HOME"])
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "kvcache"


def default_path(name: str) -> Path:
    """The default snapshot file of pool ``name``."""
    return snapshot_home() / f"{name}{SUFFIX}"


def write_atomically(path: Path, write: Callable[[int], None]) -> None:
    """Create ``path`` through a fsynced temporary file and a rename.

    Args:
        write: fills the file through the descriptor it is given.

    Raises:
        SnapshotError: the folder cannot be created or written, or the disk is full;
            the previous file at ``path`` is untouched.
    """
    folder = path.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SnapshotError(
            f"cannot create folder {folder} ({exc.strerror}): pick another --path"
        ) from exc
    _remove_abandoned_temps(path)
    pid, start = me().pid, me().start
    temp = folder / f".{path.name}.{pid}-{start}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SnapshotError(
            f"cannot write in {folder} ({exc.strerror}): pick another --path"
        ) from exc
    try:
        try:
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
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
    _fsync_folder(folder)


def _remove_abandoned_temps(path: Path) -> None:
    """Delete temporary files that persists of ``path`` killed mid-write left behind.

    A temp file's name carries its writer's pid and start time, so only files
    of dead writers go; a concurrent persist by a live process is left alone.
    """
    for temp in path.parent.glob(f".{glob.escape(path.name)}.*-*.*.tmp"):
        writer = temp.name[len(path.name) + 2 :].split(".", 1)[0]
        pid, _, start = writer.partition("-")
        if pid.isdigit() and start.isdigit() and not _is_alive(int(pid), int(start)):
            temp.unlink(missing_ok=True)


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


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_alive(pid: int, start: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return int(stat[stat.rindex(b")") + 2 :].split()[19]) == start
