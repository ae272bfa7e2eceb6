"""Files under construction: who is still building them, and removing the abandoned ones.

A pool is built under a hidden name in the shared-memory folder and a
snapshot under a hidden temporary name next to its destination; both get
their final name only when complete. A builder that dies first (the OOM
killer, SIGKILL, a crash) leaves its hidden file behind, and in /dev/shm that
file is RAM that nothing else frees.

So a builder holds a lease (:mod:`kvcache.leases`, a kernel-held OFD lock) on
byte 0 of its file from right after creating it until the file has its final
name; the kernel drops the lease when the builder dies, in whatever PID
namespace it ran. :func:`remove_abandoned` removes the hidden files whose
lease nobody holds. (Pids, even with start times, cannot tell: a builder in
another container of the pod has a pid that means nothing here.) Byte 0 is
the lease's alone: pool process slots lock bytes from 4096 up, and the pool
lock is a ``flock``, which never meets OFD locks.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from . import leases

LEASE_BYTE = 0
MIN_AGE_S = 10.0
"""A hidden file younger than this is never removed, leased or not: its
builder takes the lease right after ``open(O_CREAT|O_EXCL)`` returns, so a file
seen between those two calls has a free lease and a live builder. The window
is one system call long; 10 s also covers a builder that is descheduled or
stopped there. A builder's own writes keep the modification time fresh."""


def hold(fd: int) -> None:
    """Take the lease on the file just created as ``fd`` (exclusively, by this builder)."""
    if not leases.try_hold(fd, LEASE_BYTE):  # nobody else has this file's name yet
        raise RuntimeError(f"another process holds the build lease of fd {fd}'s new file")


def release(fd: int) -> None:
    """Give up the lease once the file has its final name."""
    leases.release(fd, LEASE_BYTE)


def remove_abandoned(paths: Iterable[Path], *, min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Remove the files among ``paths`` whose builder is gone; return those removed.

    A file goes if it is a regular file of this user, nobody holds its lease,
    and it was last modified at least ``min_age_s`` ago. Other users' files are
    left alone, even by root: their own next create removes them, and a file
    of theirs is theirs to explain (see :mod:`kvcache.owners`).
    """
    removed = []
    now = time.time()
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # gone already (published or removed), not ours, or a symlink
        try:
            info = os.fstat(fd)
            if (
                stat.S_ISREG(info.st_mode)
                and info.st_uid == os.geteuid()
                and now - info.st_mtime >= min_age_s
                and not leases.is_held(fd, LEASE_BYTE)
            ):
                with contextlib.suppress(FileNotFoundError, PermissionError):
                    os.unlink(path)
                    removed.append(path)
        finally:
            os.close(fd)
    return removed


def fsync_folder(folder: Path) -> None:
    """Make the names just given in ``folder`` (a finished build's, a removal) durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
