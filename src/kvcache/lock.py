"""The pool lock: excludes threads and processes, and detects holders that died.

Two locks are needed. ``flock`` on the segment file excludes processes (and
other open file descriptions in this one), and the kernel drops it when its
holder dies, so a crash can never deadlock the pool. But ``flock`` does not
exclude threads that share one descriptor, so a ``threading.Lock`` comes
first. (POSIX ``fcntl`` record locks were rejected: closing *any* descriptor of
the file drops all of a process's locks on it.)

The header's ``dirty`` word is set for as long as the lock is held. Finding it
set on entry means the previous holder died mid-mutation; the lock then calls
``repair`` before handing over.

The header's ``retired`` word is set, under the lock, by whoever destroys the
pool or replaces it with a restore (``pool.retire``), right after the file
lost its name. Every holder checks it on entry, so a process that still has
the old file open fails its next call with ``PoolDestroyedError`` instead of
storing work that nobody else can ever see.

The lock's description is opened from the mapped descriptor
(``/proc/self/fd/N``), never from the path: the name may by then belong to
another pool (destroyed and created again, or replaced by a restore), and a
lock on that file would exclude no one who maps this one. After ``fork`` the
child shares the parent's description, and so its ``flock``:
``reopen_after_fork`` gives the child a description of its own, the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

from . import leases
from .errors import CorruptPoolError, KVCacheError, PoolClosedError, PoolDestroyedError
from .layout import DESTROYED, REPLACED, H


class PoolLock:
    """Mutual exclusion over one segment, with crash detection through ``dirty``."""

    def __init__(
        self, mapped_fd: int, header_q: memoryview, repair: Callable[[], None], name: str
    ) -> None:
        self._name = name
        self._mapped_fd = mapped_fd
        self._header_q = header_q
        self._repair = repair
        self._thread_lock = threading.Lock()
        self._closed = False
        self.fd = leases.reopen(mapped_fd)
        """The lock's own description; it also holds this holder's process-slot lease."""

    def __enter__(self) -> PoolLock:
        self._thread_lock.acquire()
        if self._closed:  # closed while this thread waited: self.fd is gone (or reused)
            self._thread_lock.release()
            raise closed_error(self._name)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        if self._closed:  # closing began while this thread waited for another process
            self._unlock()
            raise closed_error(self._name)
        header_q = self._header_q
        retired = header_q[H.retired]
        if retired or header_q[H.dirty]:  # one test on the common path, for both words
            self._settle(retired)
        header_q[H.dirty] = 1
        return self

    def _settle(self, retired: int) -> None:
        """Refuse a retired pool, or repair: after a holder that died mid-mutation (``dirty``),
        or a ``retired`` word that is neither DESTROYED nor REPLACED (damage)."""
        if retired in (DESTROYED, REPLACED):
            self._unlock()
            raise retired_error(self._name, retired)
        try:
            self._repair()
        except BaseException:
            self._unlock()  # dirty stays set: the next holder tries again
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # kvcache raises its own errors before mutating anything; any other
        # exception (a bug, KeyboardInterrupt) may have struck mid-way, and a
        # CorruptPoolError means the metadata is damaged, so in both cases the
        # pool stays marked dirty and the next holder repairs it.
        if exc is None or (isinstance(exc, KVCacheError) and not isinstance(exc, CorruptPoolError)):
            self._header_q[H.dirty] = 0
        self._unlock()

    def _unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._thread_lock.release()

    def reopen_after_fork(self) -> None:
        """In a forked child: own a fresh description and a fresh thread lock."""
        self._thread_lock = threading.Lock()
        fresh = leases.reopen(self._mapped_fd)
        os.close(self.fd)  # the parent's description, and its flock, live on in the parent
        self.fd = fresh

    @contextlib.contextmanager
    def closing(self) -> Iterator[int]:
        """Shut the lock for good, once the thread holding it (if any) lets go.

        Threads waiting for the lock then raise :class:`PoolClosedError`, as
        every later caller does, rather than lock a descriptor that was closed
        under them (EBADF, or a reused number: another file). The block runs
        with the thread lock held and the descriptor still open, to give up
        what is held through it; the descriptor is closed after. Never enter
        it from the thread holding the lock: it would wait for itself.
        """
        self._closed = True
        with self._thread_lock:
            try:
                yield self.fd
            finally:
                os.close(self.fd)

    def close(self) -> None:
        """Shut the lock (see :meth:`closing`) with nothing to give up first."""
        with self.closing():
            pass


@contextlib.contextmanager
def file_lock_only(fd: int) -> Iterator[None]:
    """The pool's file lock without the rest of ``PoolLock.__enter__``: for a closing
    handle's last counts (in ``PoolLock.closing``'s block, which holds the thread lock).
    Nothing is repaired or refused under it: only counter words change, which a crash
    mid-add leaves merely a little off."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def closed_error(name: str) -> PoolClosedError:
    """What using a closed pool raises."""
    return PoolClosedError(f"pool '{name}' was closed here: kvcache.open('{name}') again")


def retired_error(name: str, how: int) -> PoolDestroyedError:
    """What a call on a pool that was destroyed or replaced under it raises."""
    if how == REPLACED:
        return PoolDestroyedError(
            f"pool '{name}' was replaced by a restore while this process had it open: "
            f"kvcache.open('{name}') again to use the restored one"
        )
    return PoolDestroyedError(
        f"pool '{name}' was destroyed while this process had it open: "
        f"create it again, or kvcache.open('{name}') once someone has"
    )


class ClosedLock:
    """Stands in for the lock of a closed pool, so any use fails clearly (at no cost before)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        raise closed_error(self._name)

    def __exit__(self, *exc: object) -> None:
        pass  # never reached: __enter__ always raises
