"""The exact queues of ``s3fifo`` and ``arc``, kept in the segment: entry lists and ghosts.

Both policies are defined by queues (S3-FIFO: a small FIFO, a main FIFO with
reinsertion and a ghost FIFO; ARC: two LRU lists and two ghost lists). We keep
those queues exactly, in shared memory, so that every process sees one policy
and every operation costs O(1): no sampling, no scan.

**Entry lists** (``EntryQueues``): two doubly linked lists threaded through the
entry table, ``probation`` (S3-FIFO's small queue, ARC's T1) and ``main``
(S3-FIFO's main queue, ARC's T2). An entry's ``probation`` word says which list
holds it, and the header counts the probation list (``num_probation``)::

    header  probation_head -> e7 <-> e2 <-> e9 <- probation_tail   (next victim: e9)
            main_head      -> e4 <-> e1        <- main_tail
    entry   queue_prev (toward the head), queue_next (toward the tail): id + 1, 0 = none

**Ghosts** (``GhostQueue``): keys evicted lately, oldest first, each of one of
two kinds (ARC's B1 and B2; S3-FIFO uses one). The ghost region holds three
arrays of L words (L: the key index's slots, at least twice the entry slots)::

    ring    word at (position % L) = key hash | 2 | kind; 0 = gone
    older   at the same slot: the position + 1 of the previous ghost in its bucket
    heads   per bucket (key hash bits): the position + 1 of its newest ghost

A ghost is added at ``ghost_next`` (one past the newest) and chained into its
bucket; a lookup walks the bucket's chain, newest first, while positions are
still in the ring (about one step: as many buckets as positions). Each kind's
oldest is found by a tail position that only moves forward, skipping the other
kind and ghosts that left, so dropping the oldest is O(1) amortised. Keys put
again leave gaps; when the ring comes round to a ghost still there, the ring is
compacted (every ghost requeued, in order, in a few numpy passes), so no ghost
is lost early: ghosts are at most the live entries (S3-FIFO's 90% of them,
ARC's two lists together all of them), so a compaction frees half the ring or
more, and its cost is O(1) amortised per ghost added.
"""

from __future__ import annotations

import numpy as np

from .errors import corrupt
from .layout import CLOCK_LIMIT, ENTRY_WORDS, READY, E, H, Views, stored_hash
from .sketch import RequestCounts
from .tree import ChunkTree

PROBATION, MAIN = 1, 0
"""The two lists (and the two kinds of ghost): an entry's ``probation`` word."""
_HEAD = {PROBATION: H.probation_head, MAIN: H.main_head}
_TAIL = {PROBATION: H.probation_tail, MAIN: H.main_tail}
_GHOST_TAIL = {PROBATION: H.ghost_tail_probation, MAIN: H.ghost_tail_main}
_NUM_GHOSTS = {PROBATION: H.num_ghosts_probation, MAIN: H.num_ghosts_main}


class EntryQueues:
    """The two entry lists: push at the head, take from the tail, unlink from anywhere."""

    def __init__(self, views: Views) -> None:
        self._h = views.header_q
        self._q = views.entries_q

    def push(self, eid: int, kind: int) -> None:
        """Queue entry ``eid`` at the head of list ``kind`` (it must be in none)."""
        q, h, base = self._q, self._h, eid * ENTRY_WORDS
        head = h[_HEAD[kind]]
        q[base + E.probation] = kind
        h[H.num_probation] += kind
        q[base + E.queue_prev] = 0
        q[base + E.queue_next] = head
        if head:
            q[(head - 1) * ENTRY_WORDS + E.queue_prev] = eid + 1
        else:
            h[_TAIL[kind]] = eid + 1
        h[_HEAD[kind]] = eid + 1

    def unlink(self, eid: int) -> None:
        """Take entry ``eid`` out of its list, if it is in one."""
        q, h, base = self._q, self._h, eid * ENTRY_WORDS
        kind = _kind(q[base + E.probation], eid)
        prev, after = q[base + E.queue_prev], q[base + E.queue_next]
        if not prev and not after and h[_HEAD[kind]] != eid + 1:
            return  # in no list
        h[H.num_probation] -= kind
        if prev:
            q[(prev - 1) * ENTRY_WORDS + E.queue_next] = after
        else:
            h[_HEAD[kind]] = after
        if after:
            q[(after - 1) * ENTRY_WORDS + E.queue_prev] = prev
        else:
            h[_TAIL[kind]] = prev
        q[base + E.queue_prev] = q[base + E.queue_next] = 0

    def move(self, eid: int, kind: int) -> None:
        """Move entry ``eid`` to the head of list ``kind``."""
        self.unlink(eid)
        self.push(eid, kind)

    def take_place(self, eid: int, old: int) -> None:
        """Put entry ``eid`` where ``old`` is, taking ``old`` out (a key stored again keeps
        its place in its queue)."""
        q, h, old_base = self._q, self._h, old * ENTRY_WORDS
        kind = _kind(q[old_base + E.probation], old)
        prev, after = q[old_base + E.queue_prev], q[old_base + E.queue_next]
        if not prev and not after and h[_HEAD[kind]] != old + 1:
            self.push(eid, kind)  # old is in no list
            return
        base = eid * ENTRY_WORDS
        q[base + E.probation] = kind
        q[base + E.queue_prev], q[base + E.queue_next] = prev, after
        if prev:
            q[(prev - 1) * ENTRY_WORDS + E.queue_next] = eid + 1
        else:
            h[_HEAD[kind]] = eid + 1
        if after:
            q[(after - 1) * ENTRY_WORDS + E.queue_prev] = eid + 1
        else:
            h[_TAIL[kind]] = eid + 1
        q[old_base + E.queue_prev] = q[old_base + E.queue_next] = 0

    def tail(self, kind: int) -> int:
        """The entry at the tail of list ``kind`` (the next victim), or -1.

        Raises:
            CorruptPoolError: the tail is not a live entry of this list (damaged lists; a
                victim that cannot be evicted would be chosen again and again, and moving
                another list's entry off this one would leave it here for ever).
        """
        eid = self._h[_TAIL[kind]] - 1
        if eid >= 0 and (
            eid * ENTRY_WORDS >= len(self._q)
            or self._q[eid * ENTRY_WORDS + E.state] != READY
            or self._q[eid * ENTRY_WORDS + E.probation] != kind
        ):
            raise corrupt("queue lists: a list's tail is not a live entry of that list")
        return eid

    def clear(self) -> None:
        for word in (*_HEAD.values(), *_TAIL.values()):
            self._h[word] = 0


def _kind(word: int, eid: int) -> int:
    """Entry ``eid``'s list (its ``probation`` word), which damage may have made neither."""
    if word not in _HEAD:
        raise corrupt(f"queue lists: entry {eid} is in list {word}, neither probation nor main")
    return word


class GhostQueue:
    """Keys evicted lately, in eviction order, of two kinds; see the module's overview."""

    def __init__(self, views: Views) -> None:
        self._h = views.header_q
        words = views.ghost_q
        self._length = length = len(words) // 3
        self._ring = words[:length]
        self._older = words[length : 2 * length]
        self._heads = words[2 * length :]
        self._mask = length - 1  # a power of two: the index's slots
        self.num_compactions = self.num_requeued = 0  # this handle's, for tests and benchmarks

    def count(self, kind: int) -> int:
        return self._h[_NUM_GHOSTS[kind]]

    def add(self, lo: int, kind: int) -> None:
        """Remember the key hashed ``lo`` as the newest ghost of ``kind``."""
        if self._ring[self._h[H.ghost_next] % self._length]:
            self._compact()  # the ring came round to a ghost still here
        self._append((lo & ~3) | 2 | kind)

    def _append(self, word: int) -> None:
        h, ring, lo, kind = self._h, self._ring, word, word & 1
        position = h[H.ghost_next]
        slot = position % self._length
        ring[slot] = word
        bucket = (lo >> 2) & self._mask
        self._older[slot] = self._heads[bucket]
        self._heads[bucket] = position + 1
        h[H.ghost_next] = position + 1
        h[_NUM_GHOSTS[kind]] += 1

    def remove(self, lo: int) -> int:
        """Forget the ghost of the key hashed ``lo``; its kind, or -1 if there is none.

        Walks the bucket's chain, newest first, as far as positions still in the
        ring (O(1) expected: the ring has as many buckets as positions)."""
        oldest = self._h[H.ghost_next] - self._length
        found = self._heads[(lo >> 2) & self._mask]
        while found > max(oldest, 0):  # positions + 1: those <= oldest have left the ring
            slot = (found - 1) % self._length
            word = self._ring[slot]
            if word and not (word ^ lo) & ~3:
                return self._forget(slot)
            older = self._older[slot]
            if older >= found:  # each link leads to an older ghost: else a walk for ever
                raise corrupt("ghost index: a bucket's chain does not lead to older ghosts")
            found = older
        return -1

    def drop_oldest(self, kind: int) -> None:
        """Forget the oldest ghost of ``kind`` (if any)."""
        h, ring, length = self._h, self._ring, self._length
        if not h[_NUM_GHOSTS[kind]]:
            return
        end = h[H.ghost_next]
        for position in range(max(h[_GHOST_TAIL[kind]], end - length), end):
            word = ring[position % length]
            if word and word & 1 == kind:
                h[_GHOST_TAIL[kind]] = position + 1
                self._forget(position % length)
                return
        # a count that the ring does not hold: damage, not a walk round the ring for ever
        raise corrupt(f"ghost counts ({h[_NUM_GHOSTS[kind]]} of kind {kind}) exceed the ring")

    def clear(self) -> None:
        """Forget every ghost (repair does: ghosts only ever cost a little hit ratio)."""
        np.frombuffer(self._ring, np.int64)[:] = 0
        np.frombuffer(self._heads, np.int64)[:] = 0
        h = self._h
        h[H.num_ghosts_probation] = h[H.num_ghosts_main] = 0
        if not 0 <= h[H.ghost_next] < CLOCK_LIMIT:
            h[H.ghost_next] = 0
        h[H.ghost_tail_probation] = h[H.ghost_tail_main] = h[H.ghost_next]

    def _compact(self) -> None:
        """Close the gaps that keys put again left in the ring: requeue every ghost, in
        order, at fresh positions, and rebuild the bucket chains. Ghosts are at most the
        live entries (S3-FIFO's 90% of them, ARC's two ghost lists together all of them)
        and the ring at least twice the entry slots, so this frees half the ring or
        more: O(1) amortised per ghost added. The one add that compacts does it in a
        few numpy passes over the ring; the Python loop this replaced (one ``_append``
        per ghost) took 10 ms for 20,000 ghosts under the pool lock."""
        h, length = self._h, self._length
        end = h[H.ghost_next]
        start = max(min(h[H.ghost_tail_probation], h[H.ghost_tail_main]), end - length)
        ring = np.frombuffer(self._ring, np.int64)
        words = ring[np.arange(start, end) % length]
        words = words[words != 0]
        positions = np.arange(end, end + words.size, dtype=np.int64)
        buckets = (words >> 2) & self._mask
        order = np.argsort(buckets, kind="stable")  # each bucket's ghosts, oldest first
        by_bucket, in_order = buckets[order], positions[order]
        follows = np.zeros(words.size, dtype=bool)  # the one before is in the same bucket
        follows[1:] = by_bucket[1:] == by_bucket[:-1]
        older = np.zeros(words.size, dtype=np.int64)
        older[1:] = in_order[:-1] + 1
        newest = np.ones(words.size, dtype=bool)
        newest[:-1] = ~follows[1:]
        ring[:] = 0
        heads = np.frombuffer(self._heads, np.int64)
        heads[:] = 0
        ring[positions % length] = words
        np.frombuffer(self._older, np.int64)[in_order % length] = np.where(follows, older, 0)
        heads[by_bucket[newest]] = in_order[newest] + 1
        on_probation = int(np.count_nonzero(words & 1))
        h[H.ghost_next] = end + words.size
        h[H.ghost_tail_probation] = h[H.ghost_tail_main] = end
        h[H.num_ghosts_probation] = on_probation
        h[H.num_ghosts_main] = words.size - on_probation
        self.num_compactions += 1
        self.num_requeued += words.size

    def _forget(self, slot: int) -> int:
        kind = self._ring[slot] & 1
        self._ring[slot] = 0
        self._h[_NUM_GHOSTS[kind]] -= 1
        return kind


class Queues:
    """What a queue policy (``s3fifo``, ``arc``) works on: the lists, the ghosts, the counts.

    A policy's capacity in entries is ``num_live`` when it evicts (the pool is
    full then). Not the pool's entry slots: with values of many pages far fewer
    entries fit, and ghosts bounded by the slots would outnumber the entries
    many times over (ARC's ghost lists grew to 19 times its 1,023 entries with
    16-page values in a 16,384-page pool, and each compaction of the ring then
    freed little).
    """

    def __init__(self, views: Views, tree: ChunkTree | None = None) -> None:
        self.lists = EntryQueues(views)
        self.ghosts = GhostQueue(views)
        self._h, self._hd, self._q = views.header_q, views.header_d, views.entries_q
        self._tree = tree  # a prefix-tracking pool's: an eviction takes the chunks below
        self._walked: tuple[int, list[int]] | None = None
        g = views.geometry
        self.counts = (  # how often each key was asked for lately: prefix pools (format 12)
            RequestCounts(views.sketch, self._h, H.sketch_counted, g.max_entries)
            if g.sketch_bytes
            else None
        )

    def descendants(self, eid: int) -> list[int]:
        """The entries an eviction of ``eid`` takes with it (chunks below it), leaves first;
        kept for that eviction (``take_descendants``), so a victim's chain is walked once."""
        below = self._tree.descendants(eid) if self._tree is not None else []
        self._walked = (eid, below)
        return below

    def take_descendants(self, eid: int) -> list[int] | None:
        """What ``descendants`` found for ``eid``, if it was the last walk, and forget it.
        Only for a victim just chosen, in the same hold of the lock: another process may
        change the tree once it is released."""
        walked, self._walked = self._walked, None
        return walked[1] if walked is not None and walked[0] == eid else None

    @property
    def num_probation(self) -> int:
        return self._h[H.num_probation]

    @property
    def num_live(self) -> int:
        """The entries in the lists: the cache size in entries, once the pool is full."""
        return self._h[H.num_live]

    @property
    def num_main(self) -> int:
        return self._h[H.num_live] - self._h[H.num_probation]

    @property
    def target(self) -> float:
        """ARC's p: how many entries its T1 (probation) may hold before it gives way."""
        return self._hd[H.probation_target]

    @target.setter
    def target(self, value: float) -> None:
        self._hd[H.probation_target] = value

    @property
    def last_admitted(self) -> tuple[int, int]:
        """The entry ``prefix`` admitted last and the kind of its key's ghost (-1: none), or
        (-1, -1)."""
        word = self._h[H.last_admitted]
        return word // 4 - 1, word % 4 - 1

    @last_admitted.setter
    def last_admitted(self, admitted: tuple[int, int]) -> None:
        eid, recalled = admitted
        self._h[H.last_admitted] = (eid + 1) * 4 + recalled + 1

    def reads(self, eid: int) -> int:
        return self._q[eid * ENTRY_WORDS + E.reads]

    def set_reads(self, eid: int, reads: int) -> None:
        self._q[eid * ENTRY_WORDS + E.reads] = reads

    def parent(self, eid: int) -> int:
        """The chunk entry ``eid`` was put under (a prefix-tracking pool's tree), or -1."""
        return self._tree.parent(eid) if self._tree is not None else -1

    def has_two_children(self, eid: int) -> bool:
        """Whether chunk ``eid`` holds two children or more now (``ChunkTree``)."""
        return self._tree is not None and self._tree.has_two_children(eid)

    def key_hash(self, eid: int) -> int:
        return self._q[eid * ENTRY_WORDS + E.hash_lo]

    def count_request(self, eid: int) -> None:
        """Count a request for entry ``eid``'s key, where the pool counts them."""
        if self.counts is not None:
            self.counts.count(*stored_hash(self._q, eid))

    def asked(self, eid: int) -> int:
        """How often entry ``eid``'s key was asked for lately (0 where nothing counts)."""
        return 0 if self.counts is None else self.counts.asked(*stored_hash(self._q, eid))

    def depth(self, eid: int) -> int:
        """The chunks before entry ``eid`` in its prompt (``ChunkTree``; 0 without a tree)."""
        return self._tree.depth(eid) if self._tree is not None else 0

    def last_use(self, eid: int) -> int:
        """The logical clock of entry ``eid``'s last put or hit."""
        return self._q[eid * ENTRY_WORDS + E.last_access]


def find_problems(views: Views, ready: list[int]) -> list[str]:
    """How the entry lists fail to hold each READY entry exactly once, or the ghost counts
    fail to match the ring (``Pool.check``; repair rebuilds both)."""
    q, h, expected = views.entries_q, views.header_q, set(ready)
    found: set[int] = set()
    for kind in (PROBATION, MAIN):
        prev, eid = 0, h[_HEAD[kind]]
        while eid:
            if not 0 < eid <= views.geometry.max_entries or eid - 1 in found:
                return ["queue lists: a link leaves the entry table or loops"]
            base = (eid - 1) * ENTRY_WORDS
            if eid - 1 not in expected or q[base + E.probation] != kind:
                return [f"queue lists: entry {eid - 1} is not a ready entry of its list"]
            if q[base + E.queue_prev] != prev:
                return [f"queue lists: entry {eid - 1} does not link back to its predecessor"]
            found.add(eid - 1)
            prev, eid = eid, q[base + E.queue_next]
        if h[_TAIL[kind]] != prev:
            return ["queue lists: a list's tail is not its last entry"]
    if found != expected:
        return [f"queue lists hold {len(found)} entries, {len(expected)} ready"]
    position = h[H.ghost_next]
    if not 0 <= position < CLOCK_LIMIT or not all(
        0 <= h[_GHOST_TAIL[kind]] <= position for kind in (PROBATION, MAIN)
    ):
        return ["ghost ring positions are out of range"]
    words = np.frombuffer(views.ghost_q, np.int64)
    length = len(words) // 3
    ring, older, heads = words[:length], words[length : 2 * length], words[2 * length :]
    slots = np.flatnonzero(ring)
    positions = position - 1 - (position - 1 - slots) % length  # each ghost's, in the ring
    if (heads < 0).any() or (heads > position).any() or (older[slots] > positions).any():
        return ["ghost index: a bucket's chain does not lead to older ghosts"]
    on_probation = int(np.count_nonzero(ring & 1))
    counts = (h[H.num_ghosts_probation], h[H.num_ghosts_main])
    if counts != (on_probation, int(np.count_nonzero(ring)) - on_probation):
        return [f"ghost counts {counts} do not match the ghost ring"]
    return []


def rebuild(views: Views, ready: np.ndarray) -> None:
    """Requeue the READY entries after a crash: probation in insert order, main in order of
    use (each list's oldest at its tail), reads and ARC's target back in range (a
    ``prefix`` entry's word of credits and children becomes at most three credits); forget
    the ghosts. The exact order the crash interrupted is lost; only hit ratio can suffer."""
    records, h = views.entries, views.header_q
    h[H.num_probation] = 0
    lists = EntryQueues(views)
    lists.clear()
    records["reads"][ready] = np.clip(records["reads"][ready], 0, 3)
    for kind, order in ((PROBATION, "created"), (MAIN, "last_access")):
        members = ready[(records["probation"][ready] != 0) == (kind == PROBATION)]
        for eid in members[np.argsort(records[order][members], kind="stable")].tolist():
            lists.push(eid, kind)
    target = views.header_d[H.probation_target]
    if not 0 <= target <= views.geometry.max_entries:  # not <=: NaN fails too
        views.header_d[H.probation_target] = 0.0
    GhostQueue(views).clear()
