"""Which server slot each request runs in, and what each slot is known to hold.

The proxy pins every cached request to one slot (``id_slot``), so that the
state it restored is the one the request runs on and the state it saves is the
request's own. A slot is lent to one request at a time: its lock is being
lent. A request takes the idle slot whose known tokens share the longest
prefix with its own (no restore needed), else the least recently used one.

When every slot is busy, requests wait in line, at most ``max_waiting`` of
them: beyond that :meth:`SlotTable.acquire` answers None and the request goes
to the server uncached (the server queues it itself) -- back-pressure, not an
unbounded queue in the proxy. Such a request may run in any slot, so what the
table knows of every slot is forgotten when it ends (:meth:`forget`).

What a slot holds is a hint: after a server restart, or a request the proxy
did not pin, it may be wrong. The server compares every prompt with its slot's
own tokens, so a wrong hint costs prefill time, never a wrong answer; the
proxy sees it in ``cache_n`` and counts it.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np

from ...errors import InvalidArgument
from ...prefix.states import shared_prefix

_EMPTY = np.zeros(0, np.int64)


class SlotTable:
    """The server's slots: who holds each, what each is known to hold, who waits.

    Args:
        num_slots: the server's slots (``total_slots`` in ``/props``).
        max_waiting: requests allowed to wait for a slot at once.
    """

    def __init__(self, num_slots: int, max_waiting: int) -> None:
        if num_slots < 1 or max_waiting < 0:
            raise InvalidArgument(f"bad slot table: {num_slots} slots, {max_waiting} waiting")
        self.num_slots = num_slots
        self.max_waiting = max_waiting
        self._held = [_EMPTY] * num_slots
        self._last_used = [0] * num_slots
        self._idle = set(range(num_slots))
        self._waiters: deque[asyncio.Future[int]] = deque()
        self._clock = 0

    async def acquire(self, tokens: np.ndarray) -> int | None:
        """A slot lent to the caller, or None if too many requests wait already.

        Give it back with :meth:`release`, also when the request fails.
        """
        if self._idle:
            return self._take(self._best_idle(tokens))
        if len(self._waiters) >= self.max_waiting:
            return None
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(waiter.result(), None)  # handed over as we were cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def held(self, slot: int) -> np.ndarray:
        """The tokens ``slot`` is known to hold (empty if unknown)."""
        return self._held[slot]

    def release(self, slot: int, held: np.ndarray | None) -> None:
        """Give ``slot`` back, holding ``held`` tokens (None: unknown)."""
        self._held[slot] = _EMPTY if held is None else held
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take(slot)
                waiter.set_result(slot)
                return
        self._idle.add(slot)

    def forget(self) -> None:
        """Forget what every slot holds (a server restart, a request run unpinned)."""
        self._held = [_EMPTY] * self.num_slots

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiters)

    def _best_idle(self, tokens: np.ndarray) -> int:
        return max(
            self._idle,
            key=lambda s: (shared_prefix(self._held[s], tokens), -self._last_used[s]),
        )

    def _take(self, slot: int) -> int:
        self._idle.discard(slot)
        self._clock += 1
        self._last_used[slot] = self._clock
        return slot
