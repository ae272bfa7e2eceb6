"""``Store``: one segment's engine (the interface a compiled core would implement).

A ``Store`` owns one mapped segment (shared memory or a disk file) and
everything inside it: the lock, the process table, the entry ``Table`` and the
``Evictor``. It speaks in encoded keys, value bytes and whole entries; it
knows nothing of tiers, remotes, access logs or the command line.

The lock covers metadata only. A write of a value of more than
``INLINE_COPY_MAX_BYTES`` reserves pages and a WRITING entry under the lock,
copies without it, and publishes under it; a read of such a value records the entry's generation
under the lock, copies without it, and accepts the copy only if the
generation is unchanged (a seqlock), retrying otherwise. Smaller values are
copied under the lock, which is cheaper than locking twice, except a compiled
get's plain hit of any size, which takes no lock at all (``kvcache._lookup``'s
``read``: the same seqlock, in C, letting other threads run while a large value
copies).

The interface, each call taking the lock itself:

- values: ``write`` (reserve, fill, publish), ``put_small`` (the same in one
  compiled call, where it can), ``read`` (look up and copy out), ``delete``,
  ``contains``;
- crash repair: ``repair`` (the lock calls it when a holder died mid-change).

``kvcache.engine.whole`` moves whole entries in and out of a store (snapshots
and tiers), ``kvcache.engine.upkeep`` has explicit eviction, ``check``,
listings and counters over it, and ``kvcache.engine.closing`` its ``close``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .. import durable, fastpath, recovery, segment, transfer
from ..allocator import PageAllocator
from ..config import PoolConfig
from ..counters import M, MetricsRegion
from ..errors import (
    DAMAGE_SIGNS,
    REPAIR_ADVICE,
    CorruptPoolError,
    DamagedValueError,
    InvalidArgument,
    KVCacheError,
    OutOfSharedMemoryError,
    PoolFullError,
    ValueTooLargeError,
    raise_as_damage,
    reports_damage,
)
from ..fastpath import LOCK_BUSY, NO_ROOM
from ..keys import Key, encode_key
from ..layout import ENTRY_WORDS, E, Geometry, H, Views
from ..lock import PoolLock, closed_error
from ..procs import ProcessTable
from .eviction import Evictor, Growth
from .table import History, Summed, Table

INLINE_COPY_MAX_BYTES = 64 << 10
"""Values (payloads) of up to 64 KiB are copied under the lock, on the way in as on the
way out (with their key and codec header): a 64 KiB memcpy (~5 us) costs less than the
second lock round trip the seqlock path needs."""
READ_ATTEMPTS = 4
"""A large read overtaken by concurrent eviction this many times is a miss."""
KEPT_SAMPLES = 256
"""Latency samples a process keeps back while others hold the lock (``Store.add_sample``);
more are dropped until one finds the lock free: a sample of the calls, still."""

Copied = TypeVar("Copied")
Fill = Callable[[list[memoryview]], "int | None"]
"""Writes an entry's bytes into the views given; returns their checksum, or None to refuse."""


class Store:
    """One segment's entries: the single-segment engine under a ``Pool``.

    Args:
        seg: the mapped segment.
        config: the pool's configuration, as its header records it.
        geometry: where each region lies in the segment.
        verify_reads: sum every value read against its checksum (True or None, the
            default; always, on disk), or none (False); True also sums each entry moved
            whole (tiers, snapshots), which otherwise carries its sum to where it lands.
        observe: read only, holding no process slot.
        clock: wall-clock seconds (expiry); tests inject their own.
        rng: the eviction sampler's random source.
    """

    spill: Callable[[int], None] | None = None
    """Called with a number of pages before a write reserves them, so that a chain can move
    victims elsewhere before this store evicts; None for a store alone."""

    def __init__(
        self,
        seg: segment.Segment,
        config: PoolConfig,
        geometry: Geometry,
        *,
        verify_reads: bool | None,
        observe: bool,
        clock: Callable[[], float],
        rng: np.random.Generator,
    ) -> None:
        self.name = seg.name
        self.config = config
        self.segment = seg
        self.on_disk = seg.on_disk
        self.observing = observe
        self.verify_reads = verify_reads is not False or seg.on_disk  # see kvcache.durable
        """Whether every value read is summed against its checksum."""
        self.verify_moves = verify_reads is True or seg.on_disk
        """Whether every entry moved whole (tiers, snapshots) is summed on its way out."""
        self.clock = clock
        views = self.views = Views(seg.buffer, geometry)
        data_offset = geometry.data_offset
        allocator = PageAllocator(
            views, Growth(lambda off, n: seg.reserve(data_offset + off, n, populate=True), clock)
        )
        table = self.table = Table(seg.name, config, views, seg, allocator, clock)
        if table.queues is not None:
            # Its create backed the ghost ring only for a policy that keeps queues: where the
            # header says so now (a pool writer may have changed it), back it before it is
            # written, so that a full /dev/shm is an error here, not a SIGBUS there.
            seg.allocate(*geometry.ghost_span)
        self.procs = ProcessTable(views.procs, geometry.procs_offset, probe_fd=seg.fd)
        self.lock = PoolLock(
            seg.fd, views.header_q, self.repair, self.name, self.procs.is_live_owner
        )
        writer = fastpath.compiled_writer(table.fast, config)
        # a put and its two halves are compiled for every policy the Finder serves
        fast = table.fast
        self._put: Any = None if fast is None else fast.put
        self._reserve_compiled: Any = None if fast is None else fast.reserve
        self._publish_compiled: Any = None if fast is None else fast.publish
        self._queues = table.queues is not None
        self._delete: Any = None if writer is None else writer.delete
        self.evictor = Evictor(table, self.procs, rng, writer)
        table.make_room = self.evictor.make_room
        self.metrics = MetricsRegion(views.metrics, self.lock)
        # Value bytes this process wrote and read, kept back (changed under the lock) until
        # a latency sample, a report or close adds them (kvcache.counters); and latency
        # samples (op, ns) taken while another process held the lock.
        self.bytes_in = self.bytes_out = 0
        self.samples: list[tuple[int, int]] = []
        self.slot, self.serial = -1, 0  # an observer holds none
        # The hot path's parts, bound once (an attribute lookup each, not two).
        self._hq, self._eq = views.header_q, views.entries_q
        self._lookup, self._value_views, self._summed = (
            table.lookup,
            table.value_views,
            table.summed,
        )
        self._reserve, self._publish = table.reserve, table.publish
        self._entry_slices, self._free_entry = table.entry_slices, table.free_entry
        self._drop_damaged = table.drop_damaged
        self._read_unlocked, self._present = fastpath.without_lock(table.fast)
        self._page_size = geometry.page_size_bytes
        self._pages_for = geometry.pages_for
        self.max_bytes = geometry.num_pages * geometry.page_size_bytes
        """The most bytes (key and value together) one entry may take."""
        try:
            if observe:
                with self.lock:  # a file retired meanwhile raises here: open looks again
                    pass
            else:
                self._attach(geometry)
        except BaseException:
            self.lock.close()
            raise

    @reports_damage  # a dead writer's entry freed on damaged counters
    def _attach(self, geometry: Geometry) -> None:
        """Claim a process slot and, under the lock, check the pool as a new handle must."""
        self.slot, self.serial = self.procs.claim(self.lock.fd)
        self.table.owner = (self.slot, self.serial)
        self.lock.own(self.slot, self.serial)
        with self.lock:
            if self.on_disk:
                durable.on_open(
                    self.segment,
                    self._hq,
                    self.procs,
                    self.slot,
                    self.lock.fd,
                    geometry,
                    self.repair,
                )
            self.evictor.reclaim_dead_writers()

    # ------------------------------------------------------------------ values

    def read(
        self,
        key: Key,
        copy: Callable[[bytes, transfer.Payload], Copied],
        *,
        count: bool = True,
        into: memoryview | None = None,
    ) -> Copied | None:
        """Look ``key`` up and ``copy`` its (codec header, payload views) out; None on a miss.

        ``count``: count the lookup in stats (a hit or a miss). ``into``: the
        buffer ``copy`` fills (a ``get_into``), for the compiled copy of small
        values; ``copy`` must then return the payload's length.

        Small values are copied under the lock. Larger ones are copied without
        it and kept only if the entry's generation did not change meanwhile
        (seqlock); a copy overtaken ``READ_ATTEMPTS`` times is a miss. With
        ``verify_reads`` the entry's bytes are summed too, in the copy's pass
        where it can (outside the lock for large values): a
        mismatch drops the entry, counts it damaged and is a miss. A disk pool
        reads large values from its file (``transfer.Payload``), small ones
        through the mapping, asking for their pages in one go.
        """
        try:
            key_bytes, _ = encode_key(key)
            read_unlocked = self._read_unlocked
            if (
                read_unlocked is not None
                and count
                and (into is not None or copy is transfer.materialise)
            ):
                try:
                    value = read_unlocked(
                        self.views.raw,
                        key_bytes,
                        self.clock(),
                        into,
                        self.verify_reads,
                        self.lock.word,
                    )
                except (AttributeError, ValueError):
                    self._refuse_if_closed()
                    raise
                if value is not None:
                    num_bytes = value if into is not None else len(value)
                    self.bytes_out += num_bytes  # no call between read and write: no switch
                    return value  # type: ignore[no-any-return]
            on_disk = self.on_disk
            if on_disk:
                self.segment.shed()
            fast, verify = self.table.fast, self.verify_reads
            for _ in range(READ_ATTEMPTS):
                with self.lock:
                    eid = self._lookup(key_bytes, count=count, read_ahead=on_disk)
                    if eid < 0:
                        return None
                    value_len = self._eq[eid * ENTRY_WORDS + E.value_len]
                    inline = value_len <= INLINE_COPY_MAX_BYTES
                    value = None
                    if fast is not None and inline:  # copied (and summed) in C
                        if into is not None:
                            value = fast.copy_into(
                                self.views.raw, eid, into, INLINE_COPY_MAX_BYTES, verify
                            )
                        elif copy is transfer.materialise:  # plain bytes only
                            value = fast.copy_value(
                                self.views.raw, eid, INLINE_COPY_MAX_BYTES, verify
                            )
                        if value is not None:
                            self.bytes_out += value_len if count else 0
                            if value is False:  # its bytes fail their checksum
                                self._drop_damaged(eid)
                                return None
                            return value  # type: ignore[no-any-return]
                    # Counted once the views have checked the length against the pages: a
                    # damaged length must not reach the metrics region.
                    header, payload, generation = self._value_views(eid, from_file=not inline)
                    self.bytes_out += value_len if count else 0
                    checked = self._summed(eid, payload=False) if verify else None
                    if on_disk:
                        # Even a value read from the file maps the pages of its key (in
                        # folios of up to a value's size, measured): counted the same.
                        self.segment.touched(value_len)
                    if inline:
                        if checked is None:
                            return copy(header, payload)
                        copied = _copy_verified(copy, header, payload, checked)
                        if copied is None:
                            self._drop_damaged(eid)
                        return copied
                if checked is None:
                    copied, intact = copy(header, payload), True
                else:
                    copied = _copy_verified(copy, header, payload, checked)
                    intact = copied is not None
                with self.lock:
                    if self._eq[eid * ENTRY_WORDS + E.generation] == generation:
                        if intact:
                            return copied
                        self._drop_damaged(eid)
                        return None
                count = False  # the read is counted once, however often it is tried
            return None
        except DAMAGE_SIGNS as exc:  # inline, not @reports_damage: see raise_as_damage
            raise_as_damage(self.name, exc)

    def write(
        self,
        key_bytes: bytes,
        flags: int,
        header_len: int,
        value_len: int,
        priority: int,
        expires_at: float,
        fill: Fill,
        *,
        history: History | None = None,
        under_lock: bool = False,
        replace: bool = True,
        evict_within_reserved: bool = True,
        parent: bytes | None = None,
    ) -> bool:
        """Reserve an entry, let ``fill`` write its bytes, then publish it; False if fill refused
        (or the table declined it: a prefix chunk without its parent, or ``replace`` False).

        With ``under_lock`` (small values) it all happens in one lock hold.
        Otherwise the entry waits in state WRITING, invisible to readers and
        safe from eviction, while ``fill`` copies without the lock.
        ``history`` restores a snapshot entry's policy metadata; without
        ``replace`` an entry of the same key that appeared meanwhile stays (and
        this one is dropped); ``evict_within_reserved`` is ``Table.reserve``'s.
        """
        try:
            num_pages = self._pages_for(len(key_bytes) + header_len + value_len)
            if self.on_disk:  # a test, not two calls, on the RAM pools' hot path
                self.segment.touched(num_pages * self._page_size)
                self.segment.shed()
            if self.spill is not None:
                self.spill(num_pages)
            if self.slot < 0:
                self._refuse_writes()
            # a fresh put (not a restore's or a move's) may reserve and publish in C
            compiled = (
                self._reserve_compiled is not None
                and history is None
                and replace
                and evict_within_reserved
            )
            with self.lock:
                eid = None
                if compiled:
                    eid = self._reserve_compiled(
                        self.views.raw,
                        key_bytes,
                        flags,
                        header_len,
                        value_len,
                        priority,
                        expires_at,
                        self.clock(),
                        self.slot,
                        self.serial,
                        parent,
                    )
                if eid is None:  # not compiled, or left to Python (room to make, damage)
                    eid = self._reserve(
                        flags,
                        key_bytes,
                        header_len,
                        value_len,
                        num_pages,
                        priority,
                        expires_at,
                        evict_within_reserved,
                        fresh=history is None,
                        parent=parent,
                    )
                if eid < 0:
                    return False
                generation = self._eq[eid * ENTRY_WORDS + E.generation]
                targets = self._entry_slices(eid)
                if under_lock:
                    try:
                        checksum = fill(targets)
                    except BaseException:
                        self._free_entry(eid)
                        raise
                    return self._finish(eid, checksum, history, replace, parent, compiled)
            try:
                checksum = fill(targets)
            except BaseException:
                with self.lock:
                    if self._eq[eid * ENTRY_WORDS + E.generation] == generation:
                        self._free_entry(eid)
                raise
            with self.lock:
                if self._eq[eid * ENTRY_WORDS + E.generation] != generation:
                    raise CorruptPoolError(
                        f"an entry of pool '{self.name}' was reclaimed while this live process "
                        f"wrote it: {REPAIR_ADVICE}"
                    )
                return self._finish(eid, checksum, history, replace, parent, compiled)
        except (PoolFullError, OutOfSharedMemoryError):
            self.count_error()
            raise
        except DAMAGE_SIGNS as exc:  # inline, not @reports_damage: see raise_as_damage
            raise_as_damage(self.name, exc)

    def put_small(
        self,
        key_bytes: bytes,
        flags: int,
        header: bytes,
        payload: memoryview,
        priority: int,
        expires_at: float,
        parent: bytes | None,
    ) -> int | None:
        """A fresh put of up to ``INLINE_COPY_MAX_BYTES`` (under the chunk keyed ``parent``,
        in a ``prefix`` pool) in one compiled call, which takes the lock itself where it is
        free (``kvcache._lookup``'s ``put``); where there is no room, Python's eviction makes
        it and the call is made again: the checksum it published, or None where it left the
        put to ``write`` (memory to reserve, a queue policy's room it did not make, a parent
        not here,
        damage), having written nothing."""
        put = self._put
        if put is None or self.slot < 0:
            return None
        if self.spill is not None:
            self.spill(self._pages_for(len(key_bytes) + len(header) + len(payload)))
        try:
            checksum: int | None = LOCK_BUSY
            if word := self.lock.word:  # the common case, its arguments spelt out: 0.3 us
                checksum = put(
                    self.views.raw,
                    key_bytes,
                    flags,
                    header,
                    payload,
                    priority,
                    expires_at,
                    self.clock(),
                    self.slot,
                    self.serial,
                    word,
                    False,
                    parent,
                )
            if checksum == LOCK_BUSY or (checksum == NO_ROOM and not self._queues):
                args = (key_bytes, flags, header, payload, priority, expires_at)
                owner = (self.slot, self.serial)
                total = len(key_bytes) + len(header) + len(payload)
                with self.lock:
                    if checksum == LOCK_BUSY:  # no room found already: not asked again
                        checksum = put(
                            self.views.raw, *args, self.clock(), *owner, 0, False, parent
                        )
                    if checksum == NO_ROOM and not self._queues:  # the request made: not again
                        self.evictor.room_for_put(key_bytes, self._pages_for(total))
                        checksum = put(  # lock word 0 (held here), the request made
                            self.views.raw, *args, self.clock(), *owner, 0, True
                        )
        except (PoolFullError, OutOfSharedMemoryError):
            self.count_error()
            raise
        except AttributeError:  # views dropped by a close in another thread
            self._refuse_if_closed()
            raise
        except DAMAGE_SIGNS as exc:  # a buffer released by a close in another thread, or damage
            self._refuse_if_closed()
            raise_as_damage(self.name, exc)
        if checksum is None or checksum < 0:
            return None
        self.bytes_in += len(payload)
        return checksum

    def _finish(
        self,
        eid: int,
        checksum: int | None,
        history: History | None,
        replace: bool,
        parent: bytes | None,
        compiled: bool,
    ) -> bool:
        """Publish WRITING entry ``eid`` with ``checksum`` (None: free it); in C where
        ``compiled`` (a fresh put, the compiled writes built) and the compiled publish
        takes it."""
        if checksum is None:
            self._free_entry(eid)
            return False
        published = compiled and self._publish_compiled(
            self.views.raw, eid, checksum, self.clock(), parent
        )
        if not published:
            self._eq[eid * ENTRY_WORDS + E.checksum] = transfer.as_word(checksum)
            if not self._publish(eid, history, replace=replace, parent=parent):
                return False
        self.bytes_in += self._eq[eid * ENTRY_WORDS + E.value_len]
        return True

    def _refuse_writes(self) -> None:
        """Why this handle may read but not write: an observer, or a fork without a slot."""
        if self.observing:
            raise InvalidArgument(
                f"pool '{self.name}' was opened to observe, which may read but not store: "
                f"kvcache.open('{self.name}') without observe=True to store into it"
            )
        raise PoolFullError(
            f"this process was forked while all {self.config.max_processes} process slots "
            f"of pool '{self.name}' were taken, so it may read but not write: "
            f"kvcache.open('{self.name}') again once others have closed it"
        )

    def refuse_too_large(self, num_bytes: int) -> None:
        """Raise ``ValueTooLargeError`` if an entry of ``num_bytes`` could never fit."""
        if num_bytes > self.max_bytes:
            raise ValueTooLargeError(
                f"key and value need {num_bytes} bytes but pool '{self.name}' holds "
                f"{self.config.size_bytes}: store smaller chunks or create a larger pool"
            )

    @reports_damage
    def delete(self, key_bytes: bytes) -> bool:
        """Remove the entry of ``key_bytes``; whether there was one (in C where it can:
        ``kvcache._lookup``'s ``delete``, which leaves anything it does not judge to this)."""
        with self.lock:
            if self._delete is not None:
                done: bool | None = self._delete(self.views.raw, key_bytes)
                if done is not None:
                    return done
            eid = self.table.find(key_bytes)
            if eid >= 0:
                self.table.remove(eid)
        return eid >= 0

    def _refuse_if_closed(self) -> None:
        """After a compiled call without the lock failed on the views: raise
        ``PoolClosedError`` if that is because the pool was closed (by another thread)."""
        if self.lock.closed:
            raise closed_error(self.name) from None

    @reports_damage
    def contains(self, key_bytes: bytes) -> bool:
        """Whether ``key_bytes`` has a live, unexpired entry (no effect on stats or recency):
        answered without the lock where the compiled check finds it (``kvcache._lookup``)."""
        if self._present is not None:
            try:
                if self._present(self.views.raw, key_bytes, self.clock()):
                    return True
            except (AttributeError, ValueError):
                self._refuse_if_closed()
                raise
        with self.lock:
            eid = self.table.find_present(key_bytes)
            return (
                eid >= 0 and self.views.entries_d[eid * ENTRY_WORDS + E.expires_at] > self.clock()
            )

    # ----------------------------------------------------------------- counters

    def add_sample(self, op: int, ns: int) -> None:
        """Record a latency sample (``counters.Latency``'s sink) with the kept-back bytes.
        While another holds the lock word the sample is kept back too, for a later one to
        add (past ``KEPT_SAMPLES`` kept, it is dropped): a get that copied without the
        lock must not wait for a writer's hold to time itself (beside a writer that held
        the lock nearly all the time, such gets took up to 28 ms)."""
        if self.lock.taken:
            if len(self.samples) < KEPT_SAMPLES:
                self.samples.append((op, ns))
            return
        self.samples.append((op, ns))
        try:  # not contextlib.suppress: a third of the cost of the lock hold itself
            with self.lock:
                self.add_kept_back()
        except KVCacheError:
            pass  # closed or destroyed meanwhile: the call itself succeeded, its sample goes

    def add_kept_back(self) -> None:
        """Add this process's kept-back value bytes and samples to the region; call under
        the lock."""
        self.metrics.add(self.bytes_in, self.bytes_out, self.samples)
        self.bytes_in = self.bytes_out = 0
        self.samples.clear()

    def count_error(self) -> None:
        """Count a failure served around (``errors``); never raises."""
        # closed, destroyed or damaged meanwhile: the caller's own error says more
        with contextlib.suppress(KVCacheError), self.lock:
            self.metrics.q[M.errors] += 1

    # ---------------------------------------------------------------- lifecycle

    @property
    def mode(self) -> int:
        """The segment file's permission bits."""
        return stat.S_IMODE(os.fstat(self.segment.fd).st_mode)

    def recovery_parts(self) -> recovery.Parts:
        """What ``kvcache.recovery`` inspects and rebuilds."""
        t = self.table
        return recovery.Parts(self.views, t.allocator, t.entries, t.index, self.procs, self.config)

    def repair(self) -> None:
        """Rebuild the metadata from the entries (after a crash, or ``check(repair=True)``)."""
        recovery.rebuild(self.recovery_parts())
        self.metrics.repair()
        self._hq[H.repairs] += 1


def _copy_verified(
    copy: Callable[[bytes, transfer.Payload], Copied],
    header: bytes,
    payload: transfer.Payload,
    checked: Summed,
) -> Copied | None:
    """``copy`` the value out; None if ``checked`` finds its bytes damaged.

    A verified pool (``verify_reads``, every disk pool) treats a codec header
    that cannot be decoded as damage too, found before the sum could be: a
    miss, never an error (a disk pool copied while writers ran has such
    headers in pages whose writes never landed). Damage beyond the value (a
    truncated file) is still the pool's ``CorruptPoolError``.
    """
    payload.summed_first = checked.summed_first()  # a copy into a buffer sums as it goes
    try:
        copied = copy(header, payload)
    except DamagedValueError:
        return None
    if payload.digest is not None:
        return copied if payload.digest == transfer.from_word(checked.checksum_word) else None
    return copied if checked.intact(payload.landed) else None
