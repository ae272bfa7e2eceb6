"""The entry table: slots for entries, and the dense list of live ones.

Each entry is one 256-byte record (see ``layout.ENTRY_DTYPE``) in state FREE,
WRITING (pages reserved, bytes being copied, invisible to readers) or READY
(indexed and readable). Free slots form a chain through ``next_free``; slots
never used sit above ``next_fresh_entry``.

The live list holds the ids of READY entries densely (``live_pos`` points
back), so eviction can sample live entries uniformly in O(1) however sparse the
table is, and adding or removing one is a swap with the last.

Links read from the table (the free chain's head, a live position) are
range-checked before they are followed: a damaged one is a
``CorruptPoolError``, never a write into another entry's record.
"""

from __future__ import annotations

import numpy as np

from .errors import CorruptPoolError, corrupt
from .layout import ENTRY_WORDS, FREE, READY, E, H, Views


def _damaged(what: str) -> CorruptPoolError:
    return corrupt(f"the pool's {what} is damaged")


class EntryTable:
    """Slot allocation and the live list; fields are written by the pool."""

    def __init__(self, views: Views) -> None:
        self._header_q = views.header_q
        self._q = views.entries_q
        self._live_q = views.live_q
        self._live = views.live
        self._records = views.entries
        self._max_entries = views.geometry.max_entries

    def claim(self) -> int:
        """A FREE slot's id, or -1 if every slot is in use. Bumps its generation.

        Raises:
            CorruptPoolError: the free chain leads outside the table or to a slot in use.
        """
        h, q = self._header_q, self._q
        head = h[H.free_entry_head]
        if head:
            eid = head - 1
            if not 0 <= eid < self._max_entries or q[eid * ENTRY_WORDS + E.state] != FREE:
                raise _damaged("chain of free entries")
            h[H.free_entry_head] = q[eid * ENTRY_WORDS + E.next_free]
        elif h[H.next_fresh_entry] < self._max_entries:
            eid = h[H.next_fresh_entry]
            if eid < 0:
                raise _damaged("watermark of entries")
            h[H.next_fresh_entry] = eid + 1
        else:
            return -1
        q[eid * ENTRY_WORDS + E.generation] += 1
        return eid

    def has_free_slot(self) -> bool:
        """Whether ``claim`` would succeed."""
        h = self._header_q
        return bool(h[H.free_entry_head]) or h[H.next_fresh_entry] < self._max_entries

    def release(self, eid: int) -> None:
        """Mark ``eid`` FREE (new generation, so readers notice) and chain it."""
        h, base = self._header_q, eid * ENTRY_WORDS
        q = self._q
        q[base + E.state] = FREE
        q[base + E.generation] += 1
        q[base + E.next_free] = h[H.free_entry_head]
        h[H.free_entry_head] = eid + 1

    def add_live(self, eid: int) -> None:
        """Append ``eid`` to the live list."""
        h = self._header_q
        pos = h[H.num_live]
        if not 0 <= pos < self._max_entries:
            raise _damaged("count of live entries")
        self._live_q[pos] = eid
        self._q[eid * ENTRY_WORDS + E.live_pos] = pos
        h[H.num_live] = pos + 1

    def remove_live(self, eid: int) -> None:
        """Take ``eid`` off the live list by moving the last id into its place."""
        h, q, live = self._header_q, self._q, self._live_q
        pos = q[eid * ENTRY_WORDS + E.live_pos]
        last = h[H.num_live] - 1
        if not 0 <= pos <= last < self._max_entries or live[pos] != eid:
            raise _damaged("list of live entries")
        moved = live[last]
        if not 0 <= moved < self._max_entries:
            raise _damaged("list of live entries")
        live[pos] = moved
        q[moved * ENTRY_WORDS + E.live_pos] = pos
        h[H.num_live] = last

    def live_ids(self) -> np.ndarray:
        """A copy of the ids of READY entries."""
        return self._live[: self._header_q[H.num_live]].copy()

    def rebuild(self, keep: np.ndarray) -> None:
        """Recreate the free chain and the live list from the records (repair).

        Args:
            keep: per slot, True for entries that stay (READY or live WRITING).
                Every other slot below the fresh watermark becomes FREE.
        """
        h, records = self._header_q, self._records
        used = h[H.next_fresh_entry]
        drop = np.flatnonzero(~keep[:used])
        records["state"][drop] = FREE
        records["generation"][drop] += 1
        if drop.size:
            records["next_free"][drop[1:]] = drop[:-1] + 1
            records["next_free"][drop[0]] = 0
        h[H.free_entry_head] = int(drop[-1]) + 1 if drop.size else 0
        live = np.flatnonzero(records["state"][:used] == READY)
        self._live[: live.size] = live
        records["live_pos"][live] = np.arange(live.size)
        h[H.num_live] = live.size
