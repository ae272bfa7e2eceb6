"""A deadline for a whole remote call, not for each read of its socket.

redis-py bounds each socket read by ``socket_timeout``; a server that drips
its reply a byte at a time, or a reply a planted head made long, would hold a
call for many timeouts. A ``Watchdog`` is one thread per remote link that
sleeps until the earliest deadline of the calls in flight and, when one
passes, runs that call's ``interrupt`` (the link shuts the client's sockets,
so the blocked read fails at once and the call is a miss).

Cost per call: one lock and a dict insert and delete; the thread is woken only
when a call's deadline is earlier than the one it sleeps towards.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

IDLE_EXIT_S = 5.0
"""With no call in flight this long, the thread ends (a handle opened and closed, as
``status --watch`` does each refresh, leaves no thread behind); the next call starts one."""


class Watchdog:
    """Runs the interrupt of each call that outlives its deadline."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._wake = threading.Condition(threading.Lock())
        self._calls: dict[int, tuple[float, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._sleeps_until = float("inf")
        self._thread: threading.Thread | None = None

    @contextmanager
    def deadline(self, seconds: float, interrupt: Callable[[], None]) -> Iterator[None]:
        """Run the block; if it is still running after ``seconds``, call ``interrupt``."""
        at = time.monotonic() + seconds
        call = next(self._ids)
        with self._wake:
            self._calls[call] = (at, interrupt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=self._name, daemon=True)
                self._thread.start()
            elif at < self._sleeps_until:
                self._wake.notify()
        try:
            yield
        finally:
            with self._wake:
                self._calls.pop(call, None)

    def _watch(self) -> None:
        idle_waits = 0
        while True:
            with self._wake:
                now = time.monotonic()
                late = [call for call, (at, _) in self._calls.items() if at <= now]
                interrupts = [self._calls.pop(call)[1] for call in late]
                if not interrupts:
                    idle_waits = 0 if self._calls else idle_waits + 1
                    if idle_waits > 1:  # a whole IDLE_EXIT_S with no call in flight
                        self._thread = None  # the next call starts another
                        return
                    self._sleeps_until = min(
                        (at for at, _ in self._calls.values()), default=now + IDLE_EXIT_S
                    )
                    self._wake.wait(self._sleeps_until - now)
                    continue
            for interrupt in interrupts:  # outside the lock: it may take a while
                interrupt()
