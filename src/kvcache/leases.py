"""Kernel-held leases: open-file-description (OFD) byte-range locks.

A lease is a write lock on one byte of a file, taken with ``F_OFD_SETLK``.
The kernel drops it when the last descriptor of the open file description
that holds it is closed, which happens when the holder dies however it dies,
and it is seen the same way from every PID namespace that shares the file.
That makes it the one liveness signal that works for containers of one pod
(shared /dev/shm, separate pids), where a pid recorded by one process means
nothing, or something else, to another.

Why OFD locks rather than the alternatives:

- classic POSIX ``F_SETLK`` locks belong to the process, and closing *any*
  descriptor of the file drops all of them (a library cannot promise that);
- ``flock`` locks the whole file, and the pool lock already uses it;
- pids (even with start times) are per namespace.

OFD locks never conflict with ``flock`` on Linux, and two descriptions of one
file in the same process conflict with each other, so each holder uses a
description of its own (``reopen``) and probes through another one.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

_FLOCK = struct.Struct("hhqqi4x")
"""``struct flock`` on Linux (x86-64 and arm64): type, whence, start, len, pid."""


def _request(kind: int, offset: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0)  # l_pid must be 0 for OFD locks


def try_hold(fd: int, offset: int) -> bool:
    """Take the lease on byte ``offset`` through ``fd``; False if another description holds it."""
    return _try_lock(fd, offset, fcntl.F_WRLCK)


def try_share(fd: int, offset: int) -> bool:
    """Take a shared lease (a read lock) on byte ``offset`` through ``fd``: many holders may
    share it, and ``is_held`` sees it while one lives; False if a description holds it
    exclusively."""
    return _try_lock(fd, offset, fcntl.F_RDLCK)


def _try_lock(fd: int, offset: int, kind: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _request(kind, offset))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def release(fd: int, offset: int) -> None:
    """Give up the lease on byte ``offset`` held through ``fd``."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _request(fcntl.F_UNLCK, offset))


def is_held(fd: int, offset: int) -> bool:
    """Whether a description other than ``fd``'s holds the lease on byte ``offset``."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _request(fcntl.F_WRLCK, offset))
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


def reopen(fd: int) -> int:
    """A new open file description of the very file ``fd`` refers to (not of its path).

    Going through ``/proc/self/fd`` means a file that was renamed over or
    unlinked since ``fd`` was opened is still the one reopened.
    """
    return os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
