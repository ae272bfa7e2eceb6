"""The key index: a 128-bit key hash -> entry id, inside the segment.

Open addressing with linear probing over ``index_slots`` int64 slots (entry
id + 1; 0 is empty, so a zeroed segment is an empty index). The table has at
least twice as many slots as entries, so probes stay short at any pool size.
Deletion shifts later members of the cluster back instead of leaving
tombstones, so lookups never slow down as entries churn.

The hashes themselves live in the entry records; the index only orders ids.

Every probe stops when it comes back to where it started: a damaged index
with no empty slot would otherwise keep a lookup of a missing key circling
forever, with the pool lock held. That is a ``CorruptPoolError``. (Comparing
with the start costs nothing on a hit at the first slot, the usual case; a
``for`` over ``range(index_slots)`` made every lookup 50 ns slower, measured.)
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import corrupt
from .layout import ENTRY_WORDS, E, Views

_FULL = "the pool's key index has no empty slot (damaged)"


class HashIndex:
    """Find, insert and remove entry ids by key hash."""

    def __init__(self, views: Views) -> None:
        self._slots_q = views.index_q
        self._slots = views.index
        self._entries_q = views.entries_q
        self._mask = views.geometry.index_slots - 1

    def find(self, hash_lo: int, hash_hi: int) -> int:
        """The id of the entry with this hash, or -1."""
        slots, q, mask = self._slots_q, self._entries_q, self._mask
        slot = home = hash_lo & mask
        while True:
            value = slots[slot]
            if not value:
                return -1
            base = (value - 1) * ENTRY_WORDS
            if q[base + E.hash_lo] == hash_lo and q[base + E.hash_hi] == hash_hi:
                return value - 1
            slot = (slot + 1) & mask
            if slot == home:
                raise corrupt(_FULL)

    def insert(self, eid: int, hash_lo: int) -> None:
        """Add ``eid`` (whose hash is not present yet)."""
        slots, mask = self._slots_q, self._mask
        slot = home = hash_lo & mask
        while slots[slot]:
            slot = (slot + 1) & mask
            if slot == home:
                raise corrupt(_FULL)
        slots[slot] = eid + 1

    def remove(self, eid: int, hash_lo: int) -> None:
        """Remove ``eid``, shifting the rest of its cluster back (no tombstones)."""
        slots, q, mask = self._slots_q, self._entries_q, self._mask
        hole = start = hash_lo & mask
        while slots[hole] != eid + 1:
            if not slots[hole]:
                return
            hole = (hole + 1) & mask
            if hole == start:
                raise corrupt(_FULL)
        probe = start = hole
        while True:
            probe = (probe + 1) & mask
            if probe == start:
                raise corrupt(_FULL)
            value = slots[probe]
            if not value:
                break
            home = q[(value - 1) * ENTRY_WORDS + E.hash_lo] & mask
            # The member at `probe` may move to `hole` unless its home lies
            # cyclically in (hole, probe]: then moving it would hide it.
            if (probe - home) & mask >= (probe - hole) & mask:
                slots[hole] = value
                hole = probe
        slots[hole] = 0

    def rebuild(self, eids: Iterable[int]) -> None:
        """Index exactly ``eids`` (repair)."""
        self._slots[:] = 0
        q = self._entries_q
        for eid in eids:
            self.insert(eid, q[eid * ENTRY_WORDS + E.hash_lo])

    def indexed_ids(self) -> list[int]:
        """Every id in the index, in slot order (for checks)."""
        return [int(v) - 1 for v in self._slots[self._slots != 0]]
