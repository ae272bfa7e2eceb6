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

``Store.read`` first asks ``read`` for the whole get of a hit without the
pool's lock (x86-64 only: see ``kvcache._lookup``): the entry's generation,
read before and after the copy, tells a copy overtaken by a writer; the hit
counter and the clock tick atomically (``Table.tick``, which holders of the
lock use too). A queue policy's hit changes its lists, so ``read`` takes the
lock's word itself for it once the value is copied, where the word is free (as
``put`` does), or leaves the queue part to the word's holder (``drain``, which
``Table.drain_deferred`` calls before anything reads the queues' order): the
copy stays outside the lock and the get never waits for it. Whatever ``read``
answers None for takes the locked path above.
``contains`` asks ``present`` first in the same way, in a pool of any policy.

``Store.put_small`` asks ``put`` for a whole put of up to 64 KiB: reserve, copy
and sum, publish, under the lock in one call, where the pages and a slot are free
and every word it follows is in range; it answers None, having written nothing,
for anything else (room to make, memory to reserve, damage), and ``Pool.put``
then writes the Python way. In a pool whose policy keeps queues (``QUEUE_POLICIES``)
the call makes the policy's part too, as ``Table.reserve`` and ``Table.publish``
make it: the new key's ghost recalled, the entry queued (a key stored again in its
old entry's place, as a hit), and in a ``prefix`` pool linked under its parent, its
request counted and its ancestors credited; where the put needs room, the same call
makes it as ``Evictor.make_room`` does (the policy's victims, their ghosts and chunk
chains), or answers NO_ROOM, having written nothing, for Python's put to make it
(a tidy with something to reclaim, damage). In a pool whose policy keeps no
queues, a larger put's two lock holds ask ``reserve`` and ``publish`` the same way
(``Store.write``), an eviction that makes room asks ``evict``, and ``Store.delete``
asks ``delete``.

In a pool with inline slots (``inline_bytes``) the same calls read, write and free an
entry's slot where its record holds no page, as ``Table.extents`` says.

The hit touch in C is the one every policy shares (the logical clock, the
decayed frequency, the access times) and, for the policies that keep queues,
their hit (``HIT_KINDS``: a read counted, or a move to main's head). Disk pools
(whose lookup reads ahead and reads keys from the file) take the Python path,
and so does a queue policy not in ``HIT_KINDS``.
"""

from __future__ import annotations

from typing import Any

from . import native, sketch
from .config import PoolConfig
from .layout import ENTRY_WORDS, E, Geometry, H
from .policies import get_policy
from .policies.s3fifo import MAX_READS
from .regret import sample_shift

ABSENT = -2
"""``find_hit``'s answer for a key certainly not in the index: the caller counts the miss."""
LOCK_BUSY = -1
"""``put``'s answer where it was to take the lock itself and did not (held, a flock user
counted, a repair due): nothing written; the caller takes the lock and calls again."""
NO_ROOM = -2
"""``put``'s answer where pages or an entry slot must be freed first: nothing written; the
caller makes room under the lock (``Evictor.room_for_put``) and calls again."""

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
    E.probation,
    E.queue_prev,
    E.queue_next,
    E.reads,
    E.last_page,
    E.priority,
    E.owner_slot,
    E.owner_serial,
    E.created,
    E.created_at,
    E.live_pos,
    E.next_free,
    E.parent,
    E.first_child,
    E.next_sibling,
    E.prev_sibling,
    E.depth,
    ENTRY_WORDS,
    H.hits,
    H.clock,
    H.retired,
    H.flock_users,
    H.probation_head,
    H.probation_tail,
    H.main_head,
    H.main_tail,
    H.num_probation,
    H.num_free_pages,
    H.free_page_head,
    H.next_fresh_page,
    H.reserved_pages,
    H.used_pages,
    H.free_entry_head,
    H.next_fresh_entry,
    H.num_live,
    H.puts,
    H.next_expiry_at,
    H.regret_seconds,
    H.regret_seconds_sum,
    H.regret_accesses,
    H.regret_accesses_sum,
    H.regret_ring,
    H.regret_next,
    H.regret_unrequested,
    H.evictions,
    H.dirty,
    H.lock_word,
    H.sketch_counted,
    H.used_slots,
    H.deferred_next,
    H.deferred_done,
    H.deferred,
    H.ghost_next,
    H.ghost_tail_probation,
    H.ghost_tail_main,
    H.num_ghosts_probation,
    H.num_ghosts_main,
    H.probation_target,
    H.last_admitted,
    H.next_sweep_puts,
)
"""The word indices the C code reads, in the order of its ``enum`` (lookup.c)."""


HIT_TOUCH, HIT_COUNTS_READS, HIT_MOVES_TO_MAIN = 0, 1, 2
HIT_KINDS = {
    "s3fifo": HIT_COUNTS_READS,  # S3FIFO.hit: one more read, at most MAX_READS
    "arc": HIT_MOVES_TO_MAIN,  # ARC.hit and PrefixPolicy.hit: to main's most recent end
    "prefix": HIT_MOVES_TO_MAIN,
}
"""What a queue policy's hit does to its queues, which the C code does the same way (a
differential test holds both to it); a policy not named here keeps no queues (it is
touched and nothing more) or takes the Python path (``hit_finder`` answers None)."""
QUEUE_POLICIES = {"s3fifo": 1, "arc": 2, "prefix": 3}
"""The queue policies whose part of a put ``put`` makes in C (admit.c): the ones in
``HIT_KINDS``, numbered as admit.c's ``enum`` (0: no queues)."""


def hit_finder(geometry: Geometry, config: PoolConfig) -> Any:
    """A ``Finder`` for a segment of this geometry, or None (not built, forced off, a queue
    policy not in ``HIT_KINDS``, or a geometry past what the C code takes: such a pool is
    served by the Python path)."""
    if native.Finder is None:
        return None
    if not get_policy(config.policy).uses_queues:
        hit_kind = HIT_TOUCH
    elif config.policy in HIT_KINDS:
        hit_kind = HIT_KINDS[config.policy]
    else:
        return None
    try:
        return new_finder(
            geometry, config.lfu_half_life, hit_kind, QUEUE_POLICIES.get(config.policy, 0)
        )
    except (ValueError, OverflowError):
        return None


def new_finder(geometry: Geometry, lfu_half_life: int, hit_kind: int, queue_policy: int = 0) -> Any:
    """``kvcache._lookup.Finder`` for ``geometry``; ValueError for one it refuses.
    ``queue_policy``: ``QUEUE_POLICIES``' number of a queue policy (0: none)."""
    g = geometry
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
        lfu_half_life,
        hit_kind,
        MAX_READS,
        g.live_offset,
        (1 << sample_shift(g.max_entries)) - 1,
        g.inline_offset,
        g.inline_bytes,
        g.sketch_offset,
        g.sketch_bytes,
        sketch.period_for(g.max_entries),
        g.ghost_offset,
        queue_policy,
        FIELDS,
    )


def without_lock(finder: Any) -> tuple[Any, Any]:
    """``finder``'s calls that a pool may make without its lock, as (``read``,
    ``present``), each None where it would only ever answer None: on a platform that
    reads this way (a queue policy's ``read`` takes the lock for its hit alone, or leaves
    the hit to the holder)."""
    if finder is None or not native.reads_without_lock:
        return None, None
    return finder.read, finder.present


RANK_KINDS = {"lru": 1, "fifo": 2, "priority": 3, "ttl": 4, "size": 5}
"""The sampled policies whose ranking of eviction candidates ``rank`` does in C (a field's
value as the score; ``lfu``'s decay is numpy's)."""


def compiled_writer(finder: Any, config: PoolConfig) -> Any:
    """``finder``, whose ``put``, ``reserve``, ``publish``, ``evict``, ``delete`` and ``rank``
    serve a pool whose policy keeps no queues (a queue policy's put admits to its lists and
    ghosts, and its eviction leaves a ghost: Python's); None otherwise."""
    if finder is None or get_policy(config.policy).uses_queues:
        return None
    return finder
