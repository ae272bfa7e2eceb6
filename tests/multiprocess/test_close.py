"""close() while other threads of the process wait for the pool lock.

Regression: ``close`` closed the lock's descriptor under
threads waiting for the lock, which then failed with ``OSError: [Errno 9] Bad
file descriptor`` (or locked whatever file reused the number), or found the
pool's views released under them; a thread that failed that way never let go
of the thread lock, and the threads behind it hung. Every waiter must get
``PoolClosedError``, and a call already under the lock must finish first.

The threads are real and blocked for real: behind the pool lock that another
process holds, or behind a thread inside the lock. They
are seen to be waiting through their Python frames, never by sleeping.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

import kvcache
from kvcache import lock as lock_module
from kvcache.layout import H

JOIN_TIMEOUT_S = 30
"""Only for the verdict "it hangs": every thread here ends in well under a second."""

HOLD_LOCK = """
import sys, kvcache
pool = kvcache.open(sys.argv[1])
with pool._engine.lock:  # the lock word or the flock, as this engine locks
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def _calls(pool: kvcache.Pool) -> dict[str, Callable[[], object]]:
    """One of each kind of call that takes the lock."""
    big = np.zeros(200_000, dtype=np.uint8)  # beyond INLINE_COPY_MAX_BYTES: the seqlock path
    return {
        # misses: a compiled hit is read without the lock (test_unlocked_reads.py)
        "get": lambda: pool.get("absent"),
        "put": lambda: pool.put("new", b"v"),
        "put-large": lambda: pool.put("large", big),
        "get_into": lambda: pool.get_into("absent", bytearray(16)),
        "delete": lambda: pool.delete("k"),
        "contains": lambda: "absent" in pool,
        "len": lambda: len(pool),
        "stats": pool.stats,
        "entries": pool.entries,
        "evict": lambda: pool.evict(percent=50),
        "check": pool.check,
    }


class _Caller(threading.Thread):
    """A thread making one call and keeping what came of it."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._call = call
        self.outcome: str | None = None

    def run(self) -> None:
        try:
            self._call()
            self.outcome = "returned"
        except BaseException as exc:
            self.outcome = f"{type(exc).__name__}: {exc}"


def _wait_until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        time.sleep(0.001)  # polling a condition, not timing anything


def _waiting_for_the_lock(thread: threading.Thread) -> bool:
    """Whether ``thread``'s innermost Python frame is ``PoolLock.__enter__`` or the
    helper it waits in for the lock word."""
    frame = sys._current_frames().get(thread.ident or -1)
    return (
        frame is not None
        and frame.f_code.co_name in ("__enter__", "_take_word")
        and frame.f_code.co_filename == lock_module.__file__
    )


def _close_with_waiters(pool: kvcache.Pool, release: Callable[[], None]) -> list[_Caller]:
    """Start a caller per call, close the pool once they all wait, then ``release`` the lock.

    Returns the callers and the closing thread (last), all finished.
    """
    waiters = [_Caller(call) for call in _calls(pool).values()]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        _wait_until(lambda w=waiter: _waiting_for_the_lock(w))
    lock = pool._engine.lock
    closer = _Caller(pool.close)
    closer.start()
    # Closing has begun once the lock is marked closed (before the fix: once close returned).
    _wait_until(lambda: getattr(lock, "_closed", False) or not closer.is_alive())
    release()
    threads = [*waiters, closer]
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [t for t in threads if t.is_alive()]
    assert hung == [], f"threads hung after close(); the others: {[t.outcome for t in threads]}"
    return threads


def _assert_all_refused(threads: list[_Caller], pool_name: str) -> None:
    *waiters, closer = threads
    assert closer.outcome == "returned"
    outcomes = [w.outcome or "" for w in waiters]
    refused = f"PoolClosedError: pool '{pool_name}' was closed here"
    assert [o for o in outcomes if not o.startswith(refused)] == []
    with kvcache.open(pool_name) as again:  # nothing left locked, dirty or leaked
        assert again.get("k") == b"value"
        assert again.check() == []
        assert again.stats().num_attached == 1


def test_threads_waiting_behind_another_process_get_pool_closed_error(make_pool, pool_name):
    pool = make_pool()
    pool.put("k", b"value")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, pool_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"

        def release() -> None:
            assert holder.stdin is not None
            holder.stdin.close()

        threads = _close_with_waiters(pool, release)
    finally:
        holder.kill()
        holder.wait(timeout=JOIN_TIMEOUT_S)
    _assert_all_refused(threads, pool_name)


def test_close_waits_for_the_thread_inside_the_lock(make_pool, pool_name):
    """The holder keeps working on the pool while close() waits; the rest are refused."""
    pool = make_pool()
    pool.put("k", b"value")
    inside, go = threading.Event(), threading.Event()
    seen: list[int] = []

    def hold() -> None:
        with pool._engine.lock:  # white-box: what every call does first
            inside.set()
            go.wait(timeout=JOIN_TIMEOUT_S)
            seen.append(pool._engine.views.header_q[H.num_live])  # the views must still be there

    holder = _Caller(hold)
    holder.start()
    assert inside.wait(timeout=JOIN_TIMEOUT_S)
    threads = _close_with_waiters(pool, go.set)
    holder.join(timeout=JOIN_TIMEOUT_S)
    assert holder.outcome == "returned" and seen == [1]
    _assert_all_refused(threads, pool_name)


def test_close_beside_threads_copying_large_values_without_the_lock(make_pool):
    """A compiled get of a large value copies without the lock and without the GIL,
    holding the pool's mapping: close() beside such readers neither fails nor takes the
    mapping from under them, and each reader gets whole values until PoolClosedError."""
    pool = make_pool("16M")
    value = bytes(range(256)) * 4096  # 1 MiB: copied with the GIL released
    pool.put("big", value)
    outcomes: list[str] = []
    reading = threading.Barrier(4)

    def read() -> None:
        reading.wait(timeout=JOIN_TIMEOUT_S)
        try:
            while True:
                if pool.get("big") != value:
                    outcomes.append("a torn or missing value")
                    return
        except kvcache.PoolClosedError:
            outcomes.append("refused")
        except BaseException as exc:
            outcomes.append(repr(exc))

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    reading.wait(timeout=JOIN_TIMEOUT_S)
    time.sleep(0.2)  # all three copying, round and round
    pool.close()
    for reader in readers:
        reader.join(timeout=JOIN_TIMEOUT_S)
    assert outcomes == ["refused"] * 3
