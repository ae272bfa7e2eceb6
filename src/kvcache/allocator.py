"""Data pages: hand out and take back fixed-size pages; values span any pages.

A value's pages form a chain through the page-link array, so a value needs no
contiguous run and a put of N bytes succeeds whenever N bytes of pages are
free: there is no external fragmentation to fail on. Free pages form one more
chain (the free list). Pages never handed out sit above ``next_fresh_page`` and
are reserved with ``posix_fallocate`` a granule at a time the first time they
are needed, so a full ``/dev/shm`` is a clean error instead of a SIGBUS.

Allocation cost is one step per page taken (Python-level); reading a chain
coalesces consecutive pages into runs so a large value is copied with few
``memcpy`` calls when its pages happen to be adjacent (they are, in a fresh pool).

Every walk is bounded (a chain by its page count, the free list by the free
pages counter) and every link is range-checked before it is followed, so
damaged links are a ``CorruptPoolError``, never a hang or a write elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import corrupt
from .layout import NO_PAGE, H, Views

RESERVE_GRANULE_BYTES = 8 << 20
"""Reserve fresh pages 8 MiB at a time: one fallocate per 8 MiB keeps the
syscall off most puts, and zeroing 8 MiB (~1 ms) under the lock stays short."""

Run = tuple[int, int]
"""(first page, number of adjacent pages)."""


class PageAllocator:
    """Free list, fresh-page watermark and memory reservation over the page links."""

    def __init__(self, views: Views, reserve: Callable[[int, int], None]) -> None:
        """``reserve(offset, length)`` backs bytes of the data region with memory."""
        self._header_q = views.header_q
        self._next_q = views.page_next_q
        self._next = views.page_next
        self._num_pages = views.geometry.num_pages
        self._page_size = views.geometry.page_size_bytes
        self._reserve = reserve

    def num_available(self) -> int:
        """Pages that can be allocated without evicting.

        Raises:
            CorruptPoolError: the counters are out of range (eviction would empty
                the pool in vain).
        """
        h = self._header_q
        num_free, fresh = h[H.num_free_pages], h[H.next_fresh_page]
        if num_free < 0 or not 0 <= fresh <= self._num_pages:
            raise corrupt("the pool's page counters are damaged")
        return num_free + self._num_pages - fresh

    def num_reserved_available(self) -> int:
        """Pages that can be allocated without evicting or reserving more memory."""
        h = self._header_q
        return h[H.num_free_pages] + h[H.reserved_pages] - h[H.next_fresh_page]

    def num_reserved(self) -> int:
        """Pages backed with memory: as many as the pool can hold while it cannot grow."""
        return self._header_q[H.reserved_pages]

    def allocate(self, num_pages: int) -> Run:
        """Take ``num_pages`` (<= available) pages; return the chain's (first, last) page
        (``NO_PAGE`` twice for none: an entry in its inline slot).

        Raises:
            OutOfSharedMemoryError: fresh pages could not be backed; nothing changed.
            CorruptPoolError: the free list or the watermarks are damaged; nothing changed.
        """
        if not num_pages:
            return NO_PAGE, NO_PAGE
        h, nxt = self._header_q, self._next_q
        from_free = min(num_pages, h[H.num_free_pages])
        from_fresh = num_pages - from_free
        if from_free < 0 or not 0 <= h[H.next_fresh_page] <= self._num_pages - from_fresh:
            raise corrupt("the pool's page counters are damaged")
        first = last = NO_PAGE
        if from_free:
            first, last = h[H.free_page_head], self._free_page(from_free)
        if from_fresh:
            self._reserve_fresh(h[H.next_fresh_page] + from_fresh)
        if from_free:
            h[H.free_page_head] = nxt[last]
            h[H.num_free_pages] -= from_free
        if from_fresh:
            start = h[H.next_fresh_page]
            end = start + from_fresh
            self._next[start : end - 1] = np.arange(start + 1, end)
            if first == NO_PAGE:
                first = start
            else:
                nxt[last] = start
            last = end - 1
            h[H.next_fresh_page] = end
        nxt[last] = NO_PAGE
        h[H.used_pages] += num_pages
        return first, last

    def _free_page(self, count: int) -> int:
        """The ``count``-th page of the free list (from 1), every link range-checked."""
        nxt, limit = self._next_q, self._num_pages
        page = self._header_q[H.free_page_head]
        for _ in range(count - 1):
            if not 0 <= page < limit:
                break
            page = nxt[page]
        if not 0 <= page < limit:
            raise corrupt("the pool's free page list is damaged")
        return page

    def free(self, first: int, last: int, num_pages: int) -> None:
        """Return a whole chain to the free list in O(1)."""
        h, limit = self._header_q, self._num_pages
        if not (0 <= first < limit and 0 <= last < limit):
            raise corrupt("an entry's page chain is damaged")
        self._next_q[last] = h[H.free_page_head]
        h[H.free_page_head] = first
        h[H.num_free_pages] += num_pages
        h[H.used_pages] -= num_pages

    def runs(self, first: int, num_pages: int) -> list[Run]:
        """The chain starting at ``first`` as runs of adjacent pages, bounds-checked.

        Raises:
            CorruptPoolError: the chain leaves the pool or ends early.
        """
        nxt, limit = self._next_q, self._num_pages
        if not 0 < num_pages <= limit:
            raise corrupt(f"an entry claims {num_pages} pages of {limit}")
        runs: list[Run] = []
        page, start, count = first, first, 0
        for _ in range(num_pages):
            if not 0 <= page < limit:
                raise corrupt(f"page chain from {first} leaves the pool")
            if page != start + count:
                runs.append((start, count))
                start, count = page, 0
            count += 1
            page = nxt[page]
        runs.append((start, count))
        return runs

    def _reserve_fresh(self, end_page: int) -> None:
        h = self._header_q
        reserved = h[H.reserved_pages]
        if not 0 <= reserved <= self._num_pages:  # too high would skip reserving: SIGBUS later
            raise corrupt("the pool's reserved-page watermark is damaged")
        if end_page <= reserved:
            return
        granule = max(1, RESERVE_GRANULE_BYTES // self._page_size)
        target = min(self._num_pages, max(end_page, reserved + granule))
        self._reserve(reserved * self._page_size, (target - reserved) * self._page_size)
        h[H.reserved_pages] = target

    def rebuild(self, owned: np.ndarray) -> None:
        """Recreate the free list and counters from the pages entries own (repair)."""
        h = self._header_q
        owned_ids = np.flatnonzero(owned)
        fresh = max(h[H.next_fresh_page], int(owned_ids[-1]) + 1 if owned_ids.size else 0)
        free_ids = np.flatnonzero(~owned[:fresh])
        if free_ids.size:
            self._next[free_ids[:-1]] = free_ids[1:]
            self._next[free_ids[-1]] = NO_PAGE
        h[H.free_page_head] = int(free_ids[0]) if free_ids.size else NO_PAGE
        h[H.num_free_pages] = free_ids.size
        h[H.next_fresh_page] = fresh
        h[H.used_pages] = owned_ids.size
