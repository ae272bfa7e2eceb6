"""The pool lock: excludes threads and processes, and detects holders that died.

A ``threading.Lock`` comes first: it excludes this process's threads, which
share one identity. Processes are then excluded in one of two ways:

- **the lock word** (compiled engine, ``kvcache._poollock``): a futex over the
  header's ``lock_word``, whose owner is this process's slot in the process
  table and that slot's serial (``kvcache.procs``). Taking and giving it back
  is an atomic instruction each, with no system call unless processes
  contend. A waiter sleeps on it for a few milliseconds at a time; after each
  sleep it asks the kernel whether the owner's slot lease is still held
  (an OFD lock, dropped when the owner dies, seen alike from every PID
  namespace) and, if not, takes the word over with a compare-and-swap, so one
  waiter only wins. The serial tells a dead owner from a later holder of its
  slot. Pids and thread ids were rejected (per namespace), and so was a
  ``pthread`` robust mutex in the mapping (its layout and owner ids belong to
  one libc, and containers of one pod may run glibc and musl).
- **flock** on the segment file (the pure-Python engine, observers, which hold
  no slot, and a process whose kernel refuses ``membarrier``): the kernel
  drops it when its holder dies. (POSIX ``fcntl`` record locks were rejected:
  closing *any* descriptor of the file drops all of a process's locks on it.)

Both kinds share one pool at once. The header's ``flock_users`` counts the
handles that lock with flock only, and while it is not zero a lock-word
holder takes the flock too, after the word (never the other way round, so no
two lockers wait for each other crosswise). A flock-only handle joins once,
before its first hold::

    flock user                               lock-word locker
    ----------                               ----------------
    take a shared lease on flock_users's     compare-and-swap the word (seq_cst)
      byte (says "a flock user lives")       read flock_users (seq_cst)
    under flock: flock_users += 1            non-zero: take the flock too
    membarrier (a full fence on every CPU
      running a lock-word locker)
    read the word: held? wait, holding
      nothing, until its owner changes or
      is dead

Either the joiner sees the word held, and waits for that hold to end (every
later hold reads the new count), or the locker's read sees the count: the
fence makes the two unable to miss each other (Dekker's pattern, with
``membarrier`` as the slow side's fence, since Python has no atomic
instructions). Lock-word lockers register for ``MEMBARRIER_CMD_GLOBAL_EXPEDITED``
so the fence costs microseconds; a process the kernel refuses that
registration locks with flock only. A closing handle takes its count back; a
handle that died leaves it, and a lock-word holder that finds the count up
while no shared lease is held sets it back to zero (checked at most once a
second), so compiled lockers do not pay for the flock once the last flock
user is gone.

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
``reopen_after_fork`` gives the child a description of its own, the same way,
and forgets the parent's identity: the child locks as the slot it claims
(``own``), or with flock only.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType

from . import leases, native
from .errors import CorruptPoolError, KVCacheError, PoolClosedError, PoolDestroyedError
from .layout import DESTROYED, REPLACED, H

IsLive = Callable[[int, int], bool]
"""``is_live(slot, serial_low)``: whether that slot's holder, with those low 32 bits of
its serial, still runs (``ProcessTable.is_live_owner``)."""

_word = native.poollock
_LOCK_AT, _USERS_AT = H.lock_word, H.flock_users
USERS_LEASE_BYTE = H.flock_users * 8
"""Each flock user holds a shared lease on this byte (the ``flock_users`` word's first):
a header byte, which no process slot's lease (from the process table on) and no
builder's lease (byte 0) uses."""
_WAITERS = 1 << 31
_SLOT_MASK = (1 << 21) - 1  # max_processes is at most 2**20
_WORD_MASK = (1 << 64) - 1
_RECLAIM_EVERY_S = 1.0
_MEMBARRIER_CMD_GLOBAL, _MEMBARRIER_CMD_GLOBAL_EXPEDITED = 1, 2
_MEMBARRIER_SYSCALL = {"x86_64": 324, "aarch64": 283}.get(platform.machine(), -1)


def owner_word(slot: int, serial: int) -> int:
    """The lock word of the holder of ``slot`` as ``serial`` (see ``kvcache._poollock``)."""
    return ((serial & 0xFFFFFFFF) << 32) | (slot + 1)


def _owner_of(word: int) -> tuple[int, int]:
    """(slot, low 32 bits of the serial) named by a lock word; slot -1 names no one."""
    return (word & _SLOT_MASK) - 1, word >> 32


def fence() -> bool:
    """A full memory barrier on every CPU running a lock-word locker (``membarrier``);
    False where the kernel refuses both kinds."""
    if _MEMBARRIER_SYSCALL < 0:
        return False
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    for command in (_MEMBARRIER_CMD_GLOBAL_EXPEDITED, _MEMBARRIER_CMD_GLOBAL):
        if syscall(_MEMBARRIER_SYSCALL, command, 0, 0) == 0:
            return True
    return False


class PoolLock:
    """Mutual exclusion over one segment, with crash detection through ``dirty``.

    Args:
        mapped_fd: the segment's mapped descriptor (the lock reopens its own).
        header_q: the header's words.
        repair: mends the pool after a holder that died mid-mutation.
        name: the pool's name, for messages.
        is_live: whether a lock word's owner still runs (see ``IsLive``).
    """

    def __init__(
        self,
        mapped_fd: int,
        header_q: memoryview,
        repair: Callable[[], None],
        name: str,
        is_live: IsLive,
    ) -> None:
        self._name = name
        self._mapped_fd = mapped_fd
        self._header_q = header_q
        self._repair = repair
        self._is_live = is_live
        self._thread_lock = threading.Lock()
        self._closed = False
        self._mine = 0  # this process's lock word; 0: flock only
        self.word = 0
        """The owner word with which a compiled call may take the lock itself while it is
        free (``kvcache._lookup``'s ``put``, and ``read`` for a queue policy's hit): this
        process's word, 0 where this handle must lock here (flock, closed). Kept beside
        ``_mine`` rather than derived: every compiled put and get reads it, and a property
        cost 60 ns there (4% of a 4 KiB get)."""
        self._counted = False  # counted in flock_users (flock only)
        self._joined = False  # ... and past the wait for a hold that missed the count
        self._flocked = False  # this hold took the flock (lock word and flock users)
        self._reclaimed_at = 0.0
        self.fd = leases.reopen(mapped_fd)
        """The lock's own description; it also holds this holder's process-slot lease."""

    @property
    def closed(self) -> bool:
        """Whether closing began (see :meth:`closing`)."""
        return self._closed

    @property
    def taken(self) -> bool:
        """Whether some holder has the lock word now: a hint, which may change at once (a
        call that must not wait for another's hold asks it first)."""
        return self._header_q[_LOCK_AT] != 0

    def own(self, slot: int, serial: int) -> None:
        """Lock through the lock word as the holder of ``slot`` as ``serial``, where the
        compiled lock is built and the kernel lets this process take part in the fence;
        else (and for a slot of -1) stay with flock. Call before the first hold."""
        if _word is not None and slot >= 0 and not self._counted and _word.register():
            self._mine = self.word = owner_word(slot, serial)

    def __enter__(self) -> PoolLock:
        self._thread_lock.acquire()
        if self._closed:  # closed while this thread waited: self.fd is gone (or reused)
            self._thread_lock.release()
            raise closed_error(self._name)
        header_q = self._header_q
        try:
            if self._mine:
                self._take_word()
            else:
                if not self._joined:
                    self._join()
                fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        if self._closed:  # closing began while this thread waited for another process
            self._unlock()
            raise closed_error(self._name)
        retired = header_q[H.retired]
        if retired or header_q[H.dirty]:  # one test on the common path, for both words
            self._settle(retired)
        header_q[H.dirty] = 1
        return self

    def _take_word(self) -> None:
        """Take the lock word, and the flock too while flock users are counted."""
        held = _word.lock(self._header_q, _LOCK_AT, _USERS_AT, self._mine)
        while held < 0:  # still held after a wait: is its owner alive?
            held = self._take_over_if_dead()
            if held < 0:
                held = _word.lock(self._header_q, _LOCK_AT, _USERS_AT, self._mine)
        if held:
            self._flock_too()

    def _take_over_if_dead(self) -> int:
        """After a wait for the lock word: take it over if its owner died (or the word
        names no live holder: damage), as ``_poollock.lock`` answers; else -1."""
        seen = self._header_q[_LOCK_AT] & _WORD_MASK
        owner = seen & ~_WAITERS
        if owner and owner != self._mine and self._is_live(*_owner_of(owner)):
            return -1
        # dead, or this process's own word left behind by an interrupted hold (the
        # thread lock says no thread here holds it)
        return _word.take_over(self._header_q, _LOCK_AT, _USERS_AT, seen, self._mine)

    def _flock_too(self) -> None:
        """Flock users are counted: take the flock after the word, and every second set
        the count back to zero if no flock user lives (it died without taking it back)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            _word.unlock(self._header_q, _LOCK_AT, _USERS_AT)
            raise
        self._flocked = True
        now = time.monotonic()
        if now - self._reclaimed_at >= _RECLAIM_EVERY_S:
            self._reclaimed_at = now
            if not leases.is_held(self._mapped_fd, USERS_LEASE_BYTE):
                self._header_q[_USERS_AT] = 0

    def _join(self) -> None:
        """Become a flock user (see the module's overview): count this handle, fence,
        then wait, holding nothing, for a lock-word hold that may have missed the count."""
        header_q = self._header_q
        if not self._counted:  # once: a join that a signal interrupted goes on from here
            if not leases.try_share(self.fd, USERS_LEASE_BYTE):
                raise CorruptPoolError(f"pool '{self._name}': the flock users' lease is refused")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                header_q[_USERS_AT] = max(header_q[_USERS_AT], 0) + 1
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            self._counted = True
        fence()  # refused (old kernel, seccomp): the flock calls' own barriers, see docs
        seen = header_q[_LOCK_AT] & _WORD_MASK & ~_WAITERS
        pause_s = 0.0001
        while seen and header_q[_LOCK_AT] & _WORD_MASK & ~_WAITERS == seen:
            if not self._is_live(*_owner_of(seen)):
                break  # it does nothing more; whoever takes the word over reads the count
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.005)
        self._joined = True

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
        self._let_go()
        self._thread_lock.release()

    def _let_go(self) -> None:
        """Give up what excludes other processes (the thread lock stays held)."""
        if self._mine:
            if self._flocked:
                self._flocked = False
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            _word.unlock(self._header_q, _LOCK_AT, _USERS_AT)
        else:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def others_excluded(self) -> Iterator[None]:
        """Exclude other processes without the rest of ``__enter__``: for a closing handle's
        last counts (in :meth:`closing`'s block, which holds the thread lock). Nothing is
        repaired or refused under it: only counter words change, which a crash mid-add
        leaves merely a little off."""
        if not self._mine:
            with file_lock_only(self.fd):
                yield
            return
        self._take_word()
        try:
            yield
        finally:
            self._let_go()

    def reopen_after_fork(self) -> None:
        """In a forked child: own a fresh description and a fresh thread lock, and lock
        with flock only until ``own`` names the child's slot (the parent's word is the
        parent's, and so is its place among the flock users)."""
        self._thread_lock = threading.Lock()
        fresh = leases.reopen(self._mapped_fd)
        os.close(self.fd)  # the parent's description, and its flock, live on in the parent
        self.fd = fresh
        self._mine = self.word = 0
        self._counted = self._joined = self._flocked = False

    @contextlib.contextmanager
    def closing(self) -> Iterator[int]:
        """Shut the lock for good, once the thread holding it (if any) lets go.

        Threads waiting for the lock then raise :class:`PoolClosedError`, as
        every later caller does, rather than lock a descriptor that was closed
        under them (EBADF, or a reused number: another file). The block runs
        with the thread lock held and the descriptor still open, to give up
        what is held through it; the descriptor is closed after, and a flock
        user's count is taken back before. Never enter it from the thread
        holding the lock: it would wait for itself.
        """
        self._closed = True
        self.word = 0
        with self._thread_lock:
            try:
                yield self.fd
                if self._counted:
                    with file_lock_only(self.fd):
                        self._header_q[_USERS_AT] = max(self._header_q[_USERS_AT] - 1, 0)
                    self._counted = False
            finally:
                os.close(self.fd)  # drops the flock users' lease with the slot's

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

    closed = True
    taken = False  # no other holder: a latency sample then tries the lock (and stays out)

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        raise closed_error(self._name)

    def __exit__(self, *exc: object) -> None:
        pass  # never reached: __enter__ always raises
