"""The entry table's operations, each run by a caller that holds the segment's lock.

``Table`` finds, reserves, publishes and removes entries: it keeps the index,
the live list, the page allocator, the policy's queues and prefix tree
in step with the entry table. It takes no lock and copies no value: ``Store``
takes the lock around each step and copies between them; ``Evictor`` picks
what ``remove`` frees.

An entry moves through three states::

    FREE --reserve--> WRITING --publish--> READY --remove--> FREE
                         \\------free_entry------/ (a refused or failed fill)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import NamedTuple, cast

import numpy as np

from .. import fastpath, segment, transfer
from ..allocator import PageAllocator
from ..config import MAX_KEY_BYTES, PoolConfig
from ..entries import EntryTable
from ..errors import OutOfSharedMemoryError, PoolFullError, damaged
from ..index import HashIndex
from ..keys import Key, key_hash
from ..layout import ENTRY_WORDS, KEY_IS_STR, READY, WRITING, E, H, Views
from ..policies import Policy, QueuePolicy, get_policy
from ..queues import MAIN, PROBATION, Queues
from ..regret import RegretSample
from ..tree import ChunkTree

History = tuple[int, int, float]
"""An entry's policy metadata: (created, last access) on the logical clock, and frequency."""
RECALL_AT_ADMIT = -2
"""A WRITING entry's ``reads`` word (see ``reserve``): a new key whose ghost the policy
looks up only once it is stored, after the evictions that made room (S3-FIFO's order:
such an eviction may push the key's own ghost out)."""


class Summed(NamedTuple):
    """What an entry's checksum covers, read under the lock, and the sum it was published with."""

    views: list[memoryview]  # key | value header | payload, or key | value header
    fields: tuple[int, int, int, int]  # flags, key_len, header_len, value_len
    checksum_word: int

    def computed(self, payload: list[memoryview] | tuple[memoryview, ...] = ()) -> int:
        """The checksum of what is there now (``payload``: the value's bytes, if not in views)."""
        return transfer.checksum([*self.views, *payload], *self.fields)

    def intact(self, payload: list[memoryview] | tuple[memoryview, ...] = ()) -> bool:
        return self.computed(payload) == transfer.from_word(self.checksum_word)

    def summed_first(self) -> list[bytes | memoryview]:
        """What the checksum covers before a payload not in ``views``, as summed."""
        return [transfer.RECORD_FIELDS.pack(*self.fields), *self.views]


MakeRoom = Callable[..., None]
"""``Evictor.make_room``: evict until a number of pages and a slot are free."""


class Table:
    """One segment's entries: lookups, the WRITING/READY life of an entry, and removal.

    Every method expects the caller to hold the segment's lock.
    """

    def __init__(
        self,
        name: str,
        config: PoolConfig,
        views: Views,
        seg: segment.Segment,
        allocator: PageAllocator,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self.config = config
        self.views = views
        self.hq, self.hd = views.header_q, views.header_d
        self.eq, self.ed = views.entries_q, views.entries_d
        self.data = views.data
        self.page_size = views.geometry.page_size_bytes
        self.num_pages = views.geometry.num_pages
        self.data_offset = views.geometry.data_offset
        self.inline_bytes = views.geometry.inline_bytes
        self._slot_start = views.geometry.slot_start
        self.segment = seg
        self.allocator = allocator
        self.entries = EntryTable(views)
        self.index = HashIndex(views)
        self.clock = clock
        policy: Policy = get_policy(config.policy)
        self.policy = policy
        self.tree = ChunkTree(views) if policy.tracks_prefixes else None
        self.queues = Queues(views, self.tree) if policy.uses_queues else None
        self.regret = RegretSample(views)
        self.stored_key = self._key_from_file if seg.on_disk else self.key_view
        self.owner = (-1, 0)  # the (slot, serial) written into the entries this process reserves
        self.make_room: MakeRoom = _no_room  # the Evictor's, set by Store
        # compiled hit (kvcache.fastpath): RAM pools only
        self.fast = None if seg.on_disk else fastpath.hit_finder(views.geometry, config)

    # ---------------------------------------------------------------- lookups

    def find(
        self, key_bytes: bytes, *, read_ahead: bool = False, hashed: tuple[int, int] | None = None
    ) -> int:
        """The READY entry holding exactly ``key_bytes``, or -1.

        ``read_ahead`` (a disk pool's get): ask for the entry's pages before its
        key is compared, so the key and the value arrive in one read. ``hashed``:
        the key's ``key_hash``, where the caller has it.
        """
        eid = self.index.find(*(hashed or key_hash(key_bytes)))
        if eid < 0:
            return -1
        if read_ahead:
            for offset, length in self.file_spans(eid):
                self.segment.will_need(offset, length)
        if self.stored_key(eid) != key_bytes:
            return -1  # a 128-bit hash collision: treat as absent
        return eid

    def find_present(self, key_bytes: bytes) -> int:
        """``find`` for a question that touches nothing (``contains``), answered in C where
        the key is a plain unexpired hit or certainly absent (``kvcache.fastpath``)."""
        if self.fast is not None:
            eid = self.fast.find_hit(self.views.raw, key_bytes, self.clock(), False)
            if eid >= 0:
                return eid
            if eid == fastpath.ABSENT:
                return -1
        return self.find(key_bytes)

    def is_ready(self, eid: int, generation: int) -> bool:
        """Whether ``eid`` is still the READY entry it was when ``generation`` was read."""
        base = eid * ENTRY_WORDS
        return self.eq[base + E.generation] == generation and self.eq[base + E.state] == READY

    def key_of(self, eid: int) -> Key:
        """The key of entry ``eid`` as it was given (for listings: checked, unlike lookups)."""
        if not self._key_in_range(eid):
            raise damaged(self.name, f"entry {eid}'s key is outside its pages or slot")
        key = bytes(self.key_view(eid))
        return key.decode("utf-8") if self.eq[eid * ENTRY_WORDS + E.flags] & KEY_IS_STR else key

    def _key_in_range(self, eid: int) -> bool:
        """Whether entry ``eid``'s key length is in range and its key in its first page or
        its inline slot (a key always fits in either)."""
        key_len = self.eq[eid * ENTRY_WORDS + E.key_len]
        if not 0 < key_len <= MAX_KEY_BYTES:
            return False
        if self.in_slot(eid):
            return key_len <= self.inline_bytes
        return 0 <= self.eq[eid * ENTRY_WORDS + E.first_page] < self.num_pages

    def key_view(self, eid: int) -> memoryview:
        start = self._start(eid)
        return self.data[start : start + self.eq[eid * ENTRY_WORDS + E.key_len]]

    def _key_from_file(self, eid: int) -> bytes:
        """A disk pool's ``key_view``, read with ``pread``: a fault on a cold page of the
        mapping reads far more around it, under the lock (a cold 1 MiB get took 5.0 ms
        instead of 1.2; see docs/tiers.md, "Disk pools")."""
        if not self._key_in_range(eid):
            return b""  # damaged: matches no key (as a view past the pool's end would not)
        key_len = self.eq[eid * ENTRY_WORDS + E.key_len]
        return os.pread(self.segment.fd, key_len, self.data_offset + self._start(eid))

    def lookup(self, key_bytes: bytes, *, count: bool, read_ahead: bool = False) -> int:
        """``find``, dropping an expired entry, counting a hit or miss and touching on a hit."""
        if self.fast is not None:  # a plain hit or a clean miss in C; -1: decided below
            eid = self.fast.find_hit(self.views.raw, key_bytes, self.clock(), count)
            if eid >= 0:
                return eid
            if eid == fastpath.ABSENT:  # Python's probe would find the same empty slot
                if count:
                    self._count_miss(key_hash(key_bytes))
                return -1
        hashed = key_hash(key_bytes)  # once: a miss also asks the regret sample
        eid = self.find(key_bytes, read_ahead=read_ahead, hashed=hashed)
        h = self.hq
        if eid >= 0:
            base = eid * ENTRY_WORDS
            expires_at = self.ed[base + E.expires_at]
            if expires_at != math.inf and expires_at <= self.clock():
                self.remove(eid)
                h[H.expirations] += 1
                eid = -1
        if not count:
            return eid
        if eid < 0:
            self._count_miss(hashed)
            return -1
        clock = self.tick(hit=True)
        q, d = self.eq, self.ed
        idle = clock - q[base + E.last_access]
        d[base + E.freq] = d[base + E.freq] * 2.0 ** (-idle / self.config.lfu_half_life) + 1.0
        q[base + E.last_access] = clock
        if self.queues is not None:
            cast(QueuePolicy, self.policy).hit(self.queues, eid)
        d[base + E.accessed_at] = self.clock()
        return eid

    def tick(self, *, hit: bool = False) -> int:
        """Advance the logical clock (and count a hit, with ``hit``); its new value. Where
        compiled readers tick it without the lock (``kvcache.fastpath``) this is atomic."""
        if self.fast is not None:
            clock: int = self.fast.tick(self.views.raw, hit)
            if clock >= 0:
                return clock
        h = self.hq  # pure Python, or a word out of range (which this reports)
        if hit:
            h[H.hits] += 1
        clock = h[H.clock] + 1
        h[H.clock] = clock
        return clock

    def _count_miss(self, hashed: tuple[int, int]) -> None:
        """Count a miss of the key hashed ``hashed``, and ask the regret sample about it."""
        self.hq[H.misses] += 1
        self.regret.request(*hashed, self.clock)

    def live_records(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids and record copies of the live, unexpired entries."""
        ids = self.entries.live_ids()
        records = self.views.entries[ids]
        alive = records["expires_at"] > self.clock()
        return ids[alive], records[alive]

    # ---------------------------------------------------------- an entry's bytes

    def value_views(
        self, eid: int, *, from_file: bool = False
    ) -> tuple[bytes, transfer.Payload, int]:
        """The value's codec header, its payload and its generation.

        ``from_file``: a disk pool's payload is read from its file, not the mapping.
        """
        q, base = self.eq, eid * ENTRY_WORDS
        key_len, header_len, value_len = (
            q[base + E.key_len],
            q[base + E.header_len],
            q[base + E.value_len],
        )
        extents = self.extents(eid)
        header = b"".join(self._slices(extents, key_len, header_len)) if header_len else b""
        spans = transfer.spans(extents, key_len + header_len, value_len)
        views = [self.data[offset : offset + n] for offset, n in spans]
        if not (from_file and self.segment.on_disk):
            return header, transfer.Payload(views), q[base + E.generation]
        in_file = [(self.data_offset + offset, n) for offset, n in spans]
        return header, transfer.Payload(views, self.segment.fd, in_file), q[base + E.generation]

    def extents(self, eid: int) -> list[transfer.Extent]:
        """Where entry ``eid``'s bytes lie in the data region: its inline slot, or each run of
        adjacent pages of its chain (bounds-checked: ``PageAllocator.runs``)."""
        if self.in_slot(eid):
            return [(self._slot_start(eid), self.inline_bytes)]
        q, base, page = self.eq, eid * ENTRY_WORDS, self.page_size
        runs = self.allocator.runs(q[base + E.first_page], q[base + E.num_pages])
        return [(first * page, count * page) for first, count in runs]

    def in_slot(self, eid: int) -> bool:
        """Whether entry ``eid`` lies in its inline slot: it holds no page, in a pool with
        slots (where slots are none, a record without pages is damage)."""
        return bool(self.inline_bytes) and not self.eq[eid * ENTRY_WORDS + E.num_pages]

    def held_bytes(self) -> int:
        """The bytes entries hold: their pages, and the inline slots of those in one (a pool
        of small values in slots holds them in no page). Two header words, so ``stats``
        holds the lock no longer for a million entries than for one."""
        h = self.hq
        return h[H.used_pages] * self.page_size + h[H.used_slots] * self.inline_bytes

    def _start(self, eid: int) -> int:
        """Where entry ``eid``'s bytes (its key first) begin in the data region, unchecked."""
        if self.in_slot(eid):
            return self._slot_start(eid)
        return self.eq[eid * ENTRY_WORDS + E.first_page] * self.page_size

    def file_spans(self, eid: int) -> list[transfer.Extent]:
        """(offset, length) in the pool's file of each extent of entry ``eid``'s bytes."""
        return [(self.data_offset + offset, n) for offset, n in self.extents(eid)]

    def summed(self, eid: int, *, payload: bool = True) -> Summed:
        """The entry's checksum and what it covers (``payload``: the value's bytes too)."""
        q, base = self.eq, eid * ENTRY_WORDS
        fields = (
            q[base + E.flags],
            q[base + E.key_len],
            q[base + E.header_len],
            q[base + E.value_len],
        )
        return Summed(self.entry_slices(eid, payload=payload), fields, q[base + E.checksum])

    def entry_slices(self, eid: int, *, payload: bool = True) -> list[memoryview]:
        """Views of an entry's bytes (key | value header | payload; without ``payload``: key |
        value header)."""
        q, base = self.eq, eid * ENTRY_WORDS
        total = q[base + E.key_len] + q[base + E.header_len] + (q[base + E.value_len] * payload)
        return self._slices(self.extents(eid), 0, total)

    def _slices(self, extents: list[transfer.Extent], start: int, length: int) -> list[memoryview]:
        return transfer.slices(self.data, extents, start, length)

    # ------------------------------------------------------- reserve and publish

    def reserve(
        self,
        flags: int,
        key_bytes: bytes,
        header_len: int,
        value_len: int,
        num_pages: int,
        priority: int,
        expires_at: float,
        evict_within_reserved: bool,
        *,
        fresh: bool = True,
        parent: bytes | None = None,
    ) -> int:
        """Make room, then take pages and an entry slot in state WRITING; return its id, or
        -1 if a prefix-tracking pool declines the put (before evicting anything for it).

        Args:
            evict_within_reserved: if the pool cannot grow, evict to fit the
                pages it has rather than fail with ``OutOfSharedMemoryError``.
            fresh: a put, not a restore or promotion: a new key is a request for it
                (the regret sample) and a miss to the queue policies.
            parent: a chunk's parent key; a chunk whose parent is not here is
                declined, as ``publish`` would decline it.
        """
        lo, hi = key_hash(key_bytes)
        new_key = fresh and self.index.find(lo, hi) < 0
        if new_key:
            self.regret.request(lo, hi, self.clock)
        parent_eid = -1 if parent is None else self.find(parent)
        if parent is not None and parent_eid < 0:
            return -1
        recalled = -1
        if self.queues is not None and new_key:
            if cast(QueuePolicy, self.policy).recalls_before_evicting:
                recalled = self._recall(self.queues, lo, parent_eid)
            else:
                recalled = RECALL_AT_ADMIT
        self.room(num_pages, recalled)
        try:
            first, last = self.allocator.allocate(num_pages)
        except OutOfSharedMemoryError:
            # The machine will not back more pages (a full /dev/shm, or the memory
            # check): fit the put into the pages the pool has, by evicting. Not for a
            # restore, whose report would overcount, nor for a value that cannot fit
            # them, for which evicting everything would be in vain.
            if not evict_within_reserved or num_pages > self.allocator.num_reserved():
                raise
            self.make_room(num_pages, within_reserved=True)
            first, last = self.allocator.allocate(num_pages)
        eid = self.entries.claim()
        if not num_pages:  # in its inline slot
            self.hq[H.used_slots] += 1
        q, d, base = self.eq, self.ed, eid * ENTRY_WORDS
        q[base + E.flags] = flags
        q[base + E.hash_lo] = lo
        q[base + E.hash_hi] = hi
        q[base + E.key_len] = len(key_bytes)
        q[base + E.header_len] = header_len
        q[base + E.value_len] = value_len
        q[base + E.first_page] = first
        q[base + E.last_page] = last
        q[base + E.num_pages] = num_pages
        q[base + E.priority] = priority
        q[base + E.probation] = q[base + E.queue_prev] = q[base + E.queue_next] = 0
        # until published (see _admit)
        q[base + E.reads] = recalled if self.queues is not None else 0
        d[base + E.freq] = 1.0  # a put is one access
        d[base + E.expires_at] = expires_at
        q[base + E.owner_slot], q[base + E.owner_serial] = self.owner
        q[base + E.state] = WRITING
        return eid

    def drain_deferred(self) -> None:
        """Make the queue hits that compiled readers deferred while another process held the
        lock (``kvcache.fastpath``): before a put is queued, and before anything reads the
        queues' order (a victim, a ranking)."""
        if self.queues is not None and self.fast is not None:
            self.fast.drain(self.views.raw)

    def request(self, key_bytes: bytes) -> None:
        """A put of ``key_bytes``, if this pool does not hold it, is a request for the regret
        sample."""
        lo, hi = key_hash(key_bytes)
        if self.index.find(lo, hi) < 0:
            self.regret.request(lo, hi, self.clock)

    def room(self, num_pages: int, recalled: int = -1) -> None:
        """``make_room``, where a pool with nothing left to evict and no one writing is
        damaged (its free counts are wrong)."""
        try:
            self.make_room(num_pages, recalled=recalled)
        except PoolFullError:
            if (self.views.entries["state"] == WRITING).any():
                raise
            raise damaged(self.name, "no room, yet no entry is left to evict") from None

    def publish(
        self,
        eid: int,
        history: History | None = None,
        *,
        replace: bool = True,
        parent: bytes | None = None,
    ) -> bool:
        """Make a WRITING entry READY, replacing an older entry with the same key; whether it
        was published (without ``replace``, an older entry stays and this one is freed;
        with a ``parent`` key that is not here, in a prefix-tracking pool, it is freed too).

        ``history`` (created, last access, frequency) restores an entry's policy
        metadata from a snapshot; a fresh put starts at the current clock.
        """
        q, d, h, base = self.eq, self.ed, self.hq, eid * ENTRY_WORDS
        lo = q[base + E.hash_lo]
        old = self.index.find(lo, q[base + E.hash_hi])
        if old >= 0 and not replace:
            self.free_entry(eid)
            return False
        tree = self.tree
        if tree is not None and not self._place(tree, eid, old, parent):
            self.free_entry(eid)
            return False
        if self.queues is not None:
            self.drain_deferred()  # the hits before this put, in their order
            self._admit(self.queues, eid, old, history)
        if old >= 0:
            self.remove(old)
        clock = self.tick()
        created, last_access, freq = history or (clock, clock, d[base + E.freq])
        q[base + E.created] = created
        q[base + E.last_access] = last_access
        d[base + E.freq] = freq
        d[base + E.created_at] = d[base + E.accessed_at] = self.clock()
        q[base + E.state] = READY
        q[base + E.generation] += 1
        self.index.insert(eid, lo)
        self.entries.add_live(eid)
        h[H.puts] += 1
        expires_at = d[base + E.expires_at]
        if expires_at < self.hd[H.next_expiry_at]:
            self.hd[H.next_expiry_at] = expires_at
        return True

    def _place(self, tree: ChunkTree, eid: int, old: int, parent_key: bytes | None) -> bool:
        """Link a new chunk under its parent, taking over ``old``'s children; False if the
        parent is not here, or is the chunk itself or below it."""
        parent = -1 if parent_key is None else self.find(parent_key)
        if parent_key is not None and (parent < 0 or (old >= 0 and tree.is_below(parent, old))):
            return False
        tree.link(eid, parent)
        if old >= 0:
            tree.adopt(eid, old)
        return True

    def _admit(self, queues: Queues, eid: int, old: int, history: History | None) -> None:
        """Queue a new entry by the policy. A key stored again takes the old entry's place
        and counts as a read of it (a prompt stored again after a gap must not demote the
        chunks it had cached); a restored entry (``history``) goes to probation if it was
        never read since its put (its last access is its creation), else to main."""
        q, base, policy = self.eq, eid * ENTRY_WORDS, cast(QueuePolicy, self.policy)
        if old >= 0:
            queues.set_reads(eid, queues.reads(old))
            queues.lists.take_place(eid, old)
            policy.hit(queues, eid)
        elif history is not None:
            queues.set_reads(eid, 0)
            queues.lists.push(eid, PROBATION if history[0] == history[1] else MAIN)
        else:
            recalled = q[base + E.reads]
            if recalled == RECALL_AT_ADMIT:
                recalled = self._recall(queues, q[base + E.hash_lo], -1)
            policy.admit(queues, eid, recalled)

    def _recall(self, queues: Queues, lo: int, parent: int) -> int:
        """Before a key not held is put (under the chunk ``parent``, or -1): forget its ghost
        and tell the policy; the ghost's kind (``queues.PROBATION`` or ``MAIN``), or -1 if
        its key was no ghost."""
        kind = queues.ghosts.remove(lo)
        cast(QueuePolicy, self.policy).miss(queues, kind, parent)
        return kind

    # ----------------------------------------------------------------- removal

    def drop_damaged(self, eid: int) -> None:
        """Remove a READY entry whose bytes no longer match their checksum."""
        self.remove(eid)
        self.hq[H.damaged] += 1

    def chain(self, eid: int, below: list[int] | None = None) -> list[int]:
        """What ``remove`` takes: ``eid`` and, in a prefix-tracking pool, the chunks below it
        (unreachable without it), leaves first. ``below``: those chunks, where the caller
        walked to them already in this hold of the lock."""
        if self.tree is None:
            return [eid]
        return [*(self.tree.descendants(eid) if below is None else below), eid]

    def remove(self, eid: int, chain: list[int] | None = None) -> int:
        """Unindex a READY entry and free its pages and slot, and in a prefix-tracking pool its
        descendants' (``chain``: ``self.chain(eid)``, where the caller has it); how many
        entries went."""
        doomed, tree = self.chain(eid) if chain is None else chain, self.tree
        for each in doomed:
            if tree is not None:
                tree.unlink(each)
            self._unindex(each)
        return len(doomed)

    def _unindex(self, eid: int) -> None:
        if self.queues is not None:
            self.queues.lists.unlink(eid)
        self.index.remove(eid, self.eq[eid * ENTRY_WORDS + E.hash_lo])
        self.entries.remove_live(eid)
        self.free_entry(eid)

    def free_entry(self, eid: int) -> None:
        """Give back a WRITING (or just unindexed) entry's pages and slot."""
        if self.in_slot(eid):
            self.hq[H.used_slots] -= 1
        else:
            q, base = self.eq, eid * ENTRY_WORDS
            self.allocator.free(
                q[base + E.first_page], q[base + E.last_page], q[base + E.num_pages]
            )
        self.entries.release(eid)


def _no_room(num_pages: int, **_: object) -> None:
    raise PoolFullError("no eviction is wired to this table")
