"""The compiled fast paths (``kvcache.native``), wired to one segment's layout.

``hit_finder`` builds a ``kvcache._lookup.Finder`` for a segment: a get's hit in
one C call (``find_hit``: hash the key, probe the index, confirm the stored key,
check state and expiry, touch it as a hit) and the copy of a small value
(``copy_value`` into a new ``bytes``, ``copy_into`` into a ``get_into`` buffer),
summing the entry's bytes against its checksum in the same pass where the read
verifies: the parts of a 4 KiB get that were interpreter work.

``Table.lookup`` calls ``find_hit`` first: where it answers ABSENT (the probe
met an empty slot, every word on its way in range) it only counts the miss;
where it answers -1 (an expired entry, a hash collision, every damaged word) it
runs its own Python lookup. ``Table.find_present`` (for ``contains``) does the
same without touching the entry. ``Store.read`` drops an entry whose copy
answers False (its bytes fail their checksum, as the Python path's verified
read finds) and copies the Python way whenever a copy answers None. So the
compiled path never judges damage to the pool's words itself, and both engines
answer alike by construction.

The hit touch in C is the one every policy without queues shares (the logical
clock, the decayed frequency, the access times). Pools whose policy keeps
queues (``s3fifo``, ``arc``, ``prefix``), and disk pools
(whose lookup reads ahead and reads keys from the file), take the Python path.
"""

from __future__ import annotations

from typing import Any

from . import native
from .config import PoolConfig
from .layout import ENTRY_WORDS, E, Geometry, H

ABSENT = -2
"""``find_hit``'s answer for a key certainly not in the index: the caller counts the miss."""

FIELDS = (
    E.generation,
    E.state,
    E.hash_lo,
    E.hash_hi,
    E.key_len,
    E.first_page,
    E.last_access,
    E.accessed_at,
    E.freq,
    E.expires_at,
    E.header_len,
    E.value_len,
    E.num_pages,
    E.flags,
    E.checksum,
    ENTRY_WORDS,
    H.hits,
    H.clock,
)
"""The word indices the C code reads, in the order of its ``enum`` (lookup.c)."""


def hit_finder(geometry: Geometry, config: PoolConfig) -> Any:
    """A ``Finder`` for a segment of this geometry, or None (not built, forced off, or a
    geometry past what the C code takes: such a pool is served by the Python path)."""
    if native.Finder is None:
        return None
    g = geometry
    try:
        return native.Finder(
            g.entries_offset,
            g.max_entries,
            g.index_offset,
            g.index_slots,
            g.page_next_offset,
            g.data_offset,
            g.num_pages,
            g.page_size_bytes,
            g.total_bytes,
            config.lfu_half_life,
            FIELDS,
        )
    except (ValueError, OverflowError):
        return None
