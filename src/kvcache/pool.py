"""The Pool: put/get/delete/evict/stats over one shared-memory segment.

This module wires the layers together: ``segment`` maps the file, ``lock``
serialises metadata changes, ``allocator`` hands out pages, ``entries`` and
``index`` find entries, ``policies`` pick victims, ``codec`` turns values into
bytes and ``recovery`` checks and repairs. Nothing here is cached per process:
every process reads the same header and tables.

The lock covers metadata only. A put of more than ``INLINE_COPY_MAX_BYTES``
reserves pages and a WRITING entry under the lock, copies without it, and
publishes under it; a get of such a value records the entry's generation
under the lock, copies without it, and accepts the copy only if the
generation is unchanged (a seqlock), retrying otherwise. Smaller values are
copied under the lock, which is cheaper than locking twice.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import stat
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, TypeVar, cast, overload

import numpy as np

from . import codec, durable, recovery, segment, transfer
from .allocator import PageAllocator, Run
from .config import MAX_KEY_BYTES, PoolConfig
from .counters import COUNTER_NAMES, GET, PUT, Latency, M, MetricsRegion, sample_every
from .entries import EntryTable
from .errors import (
    DAMAGE_SIGNS,
    REPAIR_ADVICE,
    CorruptPoolError,
    DamagedValueError,
    InvalidArgument,
    KVCacheError,
    OutOfSharedMemoryError,
    PoolBusyError,
    PoolDestroyedError,
    PoolFullError,
    ValueTooLargeError,
    damaged,
    raise_as_damage,
    reports_damage,
)
from .eviction import EvictionMixin, Growth
from .index import HashIndex
from .keys import Key, encode_key, key_hash
from .layout import (
    COUNTERS,
    DESTROYED,
    ENTRY_WORDS,
    KEY_IS_STR,
    PRIORITY_LIMIT,
    READY,
    REMOTE_COUNTERS,
    VALUE_IS_ARRAY,
    WRITING,
    E,
    Geometry,
    H,
    Views,
)
from .lock import ClosedLock, PoolLock, closed_error, file_lock_only
from .mapping import READ_ATTEMPTS, Default, Value
from .policies import QueuePolicy, get_policy, rank_victims
from .procs import ProcessTable, me
from .queues import MAIN, PROBATION, Queues
from .regret import RegretSample
from .remote.mixin import RemoteMixin
from .reports import EntryInfo, PoolMetrics, PoolStats
from .settings import AccessLogMixin
from .sketch import FrequencySketch
from .stored import EntryRef, StoredEntry
from .tiers import Below, TierMixin
from .tree import ChunkTree
from .units import parse_duration, whole_number

INLINE_COPY_MAX_BYTES = 64 << 10
"""Copies up to 64 KiB happen under the lock: a 64 KiB memcpy (~5 us) costs
less than the second lock round trip the seqlock path needs."""
ENTRY_ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "lru": lambda r: r["last_access"],
    "size": lambda r: -(r["key_len"] + r["header_len"] + r["value_len"]),
    "priority": lambda r: r["priority"],
}
"""Sort keys of ``Pool.entries`` (ascending, ties by recency); ``policy`` ranks victims."""
ENTRY_SORTS = (*ENTRY_ORDERS, "policy")

Copied = TypeVar("Copied")
Timed = TypeVar("Timed")
History = tuple[int, int, float]
"""An entry's policy metadata: (created, last access) on the logical clock, and frequency."""

_open_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


RECALL_AT_ADMIT = -2
"""A WRITING entry's ``reads`` word (see ``_reserve``): a new key whose ghost the policy
looks up only once it is stored, after the evictions that made room (S3-FIFO's order:
such an eviction may push the key's own ghost out)."""


class _Summed(NamedTuple):
    """What an entry's checksum covers, read under the lock, and the sum it was published with."""

    views: list[memoryview]  # key | value header | payload, or key | value header
    fields: tuple[int, int, int, int]  # flags, key_len, header_len, value_len
    checksum_word: int

    def computed(self, payload: Sequence[memoryview] = ()) -> int:
        """The checksum of what is there now (``payload``: the value's bytes, if not in views)."""
        return transfer.checksum([*self.views, *payload], *self.fields)

    def intact(self, payload: Sequence[memoryview] = ()) -> bool:
        return self.computed(payload) == transfer.from_word(self.checksum_word)


class Pool(EvictionMixin, TierMixin, RemoteMixin, AccessLogMixin):
    """A named KV-cache pool in shared memory; use :func:`create` or :func:`open`.

    Safe to share between threads; every process that opens the same name sees
    the same entries and counters. A ``MutableMapping`` (``pool[key]``,
    ``key in pool``, ``len(pool)``, ``get``, ``pop``, ``items()``, ``update``,
    ...) and a context manager (``with`` closes it).

    It inherits from ``MutableMapping`` (through ``mapping.MappingMixin``)
    rather than registering with it, so that type checkers accept a pool where
    a mapping is expected; every mixin method that would copy the whole pool,
    or race with other processes, is overridden (``clear``, ``pop``,
    ``popitem``, the views in ``kvcache.mapping``; ``==`` here).
    ``setdefault`` and ``update`` are the mixins': they store with ``put``'s
    defaults (priority 0, the pool's ttl), and ``setdefault`` is a get then a
    put, so two processes racing on one key may both store.
    """

    # Mapping's == would copy every value of both sides, and its __eq__ makes
    # instances unhashable (open pools live in a WeakSet). A pool is a handle:
    # equal only to itself, as before it was a mapping.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(
        self,
        seg: segment.Segment,
        config: PoolConfig,
        geometry: Geometry,
        *,
        verify_reads: bool = False,
        observe: bool = False,
        clock: Callable[[], float] = time.time,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.name = seg.name
        self._observing = observe
        self._on_disk = seg.on_disk
        self.verify_reads = verify_reads or seg.on_disk  # see kvcache.durable
        self.config = config
        self._segment = seg
        self._closed = False
        self._clock = clock
        self._rng = rng if rng is not None else np.random.default_rng()
        views = self._views = Views(seg.buffer, geometry)
        self._hq, self._hd = views.header_q, views.header_d
        self._eq, self._ed = views.entries_q, views.entries_d
        self._data = views.data
        self._page_size = geometry.page_size_bytes
        self._num_pages = geometry.num_pages
        self._policy = get_policy(config.policy)
        self._tree = ChunkTree(views) if self._policy.tracks_prefixes else None
        # The ghost region is a frequency sketch where the policy keeps one, else ghosts.
        self._sketch = FrequencySketch(views) if self._policy.uses_sketch else None
        self._queues = Queues(views, self._tree) if self._policy.uses_queues else None
        self._regret = RegretSample(views, self._tree)
        self._below: Below | None = None  # set by lifecycle.open when the header names one
        self._promote = self._hq[H.promote]
        data_offset = self._data_offset = geometry.data_offset
        self._allocator = PageAllocator(
            views, Growth(lambda off, n: seg.reserve(data_offset + off, n, populate=True), clock)
        )
        self._entries = EntryTable(views)
        self._index = HashIndex(views)
        self._stored_key = self._key_from_file if seg.on_disk else self._key_view
        self._lock = PoolLock(seg.fd, self._hq, self._repair_after_crash, self.name)
        self._metrics = MetricsRegion(views.metrics, self._lock)
        self._mq = self._metrics.q
        self._latency = Latency(sample_every(), self._add_sample)
        self._gets_left = self._puts_left = self._latency.every
        # Value bytes this process put and got, kept back (changed under the lock) until
        # a latency sample, stats(), metrics() or close() adds them (kvcache.counters).
        self._bytes_in = self._bytes_out = 0
        # The slot's lease is held through the lock's own description (see procs).
        self._procs = ProcessTable(views.procs, geometry.procs_offset, probe_fd=seg.fd)
        self._slot, self._serial = -1, 0  # an observer holds none (see kvcache.open)
        try:
            if observe:
                with self._lock:  # a file retired meanwhile raises here: open looks again
                    pass
            else:
                self._attach(geometry)
        except BaseException:
            self._lock.close()
            raise
        _open_pools.add(self)

    def _attach(self, geometry: Geometry) -> None:
        """Claim a process slot and, under the lock, check the pool as a new handle must."""
        self._slot, self._serial = self._procs.claim(self._lock.fd)
        with self._lock:
            if self._on_disk:
                durable.on_open(
                    self._segment,
                    self._hq,
                    self._procs,
                    self._slot,
                    self._lock.fd,
                    geometry,
                    self._repair_after_crash,
                )
            self._reclaim_dead_writers()

    def _timed(self, op: int, call: Callable[..., Timed], *args: object, **kw: object) -> Timed:
        """``call(*args, **kw)`` timed: the sampled ``get`` or ``put`` (its countdown ran out).

        The countdown restarts one higher, since ``call`` counts itself down again; the
        untimed calls pay one attribute test for sampling, not a start time to carry.
        """
        if op == PUT:
            self._puts_left = self._latency.every + 1
        else:
            self._gets_left = self._latency.every + 1
        started = time.perf_counter_ns()
        result = call(*args, **kw)
        self._latency.stop(op, started)
        return result

    def _add_sample(self, op: int, ns: int) -> None:
        try:  # not contextlib.suppress: a third of the cost of the lock hold itself
            with self._lock:
                self._metrics.add(self._bytes_in, self._bytes_out, op, ns)
                self._bytes_in = self._bytes_out = 0
        except KVCacheError:
            pass  # closed or destroyed meanwhile: the call itself succeeded, its sample goes

    def _add_kept_back(self) -> None:
        """Add this process's kept-back value bytes to the region; call under the lock."""
        self._metrics.add(self._bytes_in, self._bytes_out)
        self._bytes_in = self._bytes_out = 0

    @property
    def tier(self) -> str:
        """``disk`` if the pool's file is on a disk, ``cpu`` if it is in RAM (shared memory)."""
        return "disk" if self._on_disk else "cpu"

    @property
    def latency(self) -> Latency:
        """This process's latency sampler for the pool (``kvcache.counters``): ``put`` and
        ``get`` time themselves with it, ``PrefixCache`` its ``lookup`` and ``retrieve``."""
        return self._latency

    def count_tokens(self, model: str, *, queried: int = 0, hit: int = 0, stored: int = 0) -> None:
        """Add to the token counters of ``model`` (a PrefixCache's; see :meth:`metrics`)."""
        self._metrics.count_tokens(model, queried, hit, stored)

    @property
    def path(self) -> Path:
        """The pool's file."""
        return self._segment.path

    # ----------------------------------------------------------------- writes

    def put(
        self,
        key: Key,
        value: Value,
        *,
        priority: int = 0,
        ttl: float | str | None = None,
        parent: Key | None = None,
    ) -> None:
        """Store ``value`` under ``key``, replacing any previous value, evicting as needed.

        Args:
            key: ``str`` (UTF-8) or ``bytes``, 1 to 1024 bytes.
            value: a bytes-like object or a numpy array (read back as the same).
            priority: for the ``priority`` policy; lower is evicted first.
            ttl: seconds (or ``"10m"``) until the entry expires; default the
                pool's ``default_ttl_s`` (never, unless configured).
            parent: the key of the chunk before this one in its prompt, for
                policies that track prefixes (``prefix``; others ignore it): the
                entry goes with its parent, and if the parent is not (or no
                longer) here, the value is not stored, since no prefix lookup
                could reach it.

        Raises:
            ValueTooLargeError: key and value exceed the whole pool.
            PoolFullError: no room can be made (all space is being written).
            OutOfSharedMemoryError: /dev/shm is full (``NotEnoughMemoryError``:
                the pool cannot grow without leaving the machine short of memory)
                and the value is larger than the pages the pool already has; a
                smaller one is stored by evicting within those pages instead.
            InvalidArgument: bad key, value, priority or ttl.
        """
        # get and put count down here, not in Latency.start: a call is half the cost
        self._puts_left -= 1
        if not self._puts_left:
            return self._timed(PUT, self.put, key, value, priority=priority, ttl=ttl, parent=parent)
        key_bytes, flags = encode_key(key)
        encoded = codec.encode(value, self._num_pages * self._page_size - len(key_bytes))
        # Inline rather than units.whole_number: this is the put path (saves ~0.2 us).
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or abs(priority) >= PRIORITY_LIMIT
        ):
            raise InvalidArgument(f"priority must be a whole number, not {priority!r}")
        ttl_s = self.config.default_ttl_s if ttl is None else parse_duration(ttl, what="ttl")
        parent_bytes = None if parent is None or self._tree is None else encode_key(parent)[0]
        expires_at = self._clock() + ttl_s if ttl_s else math.inf
        total = len(key_bytes) + len(encoded.header) + encoded.payload.nbytes
        self._refuse_too_large(total)
        pieces = (key_bytes, encoded.header, encoded.payload)
        flags |= VALUE_IS_ARRAY if encoded.is_array else 0
        # Summed from the caller's bytes before the lock is taken, so no lock hold
        # grows by it; the pages then hold exactly these bytes.
        checksum = transfer.checksum(
            pieces, flags, len(key_bytes), len(encoded.header), encoded.payload.nbytes
        )

        def fill(targets: list[memoryview]) -> int:
            transfer.scatter(targets, pieces)
            return checksum

        self._store(
            key_bytes,
            flags,
            len(encoded.header),
            encoded.payload.nbytes,
            priority,
            expires_at,
            fill,
            under_lock=total <= INLINE_COPY_MAX_BYTES,
            parent=parent_bytes,
        )
        if self._below is not None:
            self._forget_below(key)  # an older value below must never resurface
        if self._remote is not None:
            stored = StoredEntry(
                key_bytes,
                flags,
                len(encoded.header),
                encoded.payload.nbytes,
                priority,
                expires_at,
                checksum,
            )
            self._remote_after_put(stored, pieces)

    def _refuse_too_large(self, num_bytes: int) -> None:
        if num_bytes > self._num_pages * self._page_size:
            raise ValueTooLargeError(
                f"key and value need {num_bytes} bytes but pool '{self.name}' holds "
                f"{self.config.size_bytes}: store smaller chunks or create a larger pool"
            )

    def __setitem__(self, key: Key, value: Value) -> None:
        self.put(key, value)

    @reports_damage
    def delete(self, key: Key) -> bool:
        """Remove ``key``; return whether it was there."""
        key_bytes, _ = encode_key(key)
        with self._lock:
            eid = self._find(key_bytes)
            if eid >= 0:
                self._remove(eid)
        below = self._below is not None and self._forget_below(key)
        if self._remote is not None:
            self._remote.delete(key_bytes)  # queued: the remote's answer is not waited for
        return eid >= 0 or below

    def __delitem__(self, key: Key) -> None:
        if not self.delete(key):
            raise KeyError(key)

    # ------------------------------------------------------------------ reads

    @overload
    def get(self, key: Key) -> Value | None: ...
    @overload
    def get(self, key: Key, default: Default) -> Value | Default: ...
    def get(self, key: Key, default: object = None) -> object:
        """A copy of the value under ``key`` (``bytes`` or a numpy array); ``default`` on a miss."""
        self._gets_left -= 1
        if not self._gets_left:
            return self._timed(GET, self.get, key, default)
        value = self._read(key, transfer.materialise)
        if value is None and self._below is not None:
            value = self._read_below(key, transfer.materialise)
        if value is None and self._remote is not None:
            value = self._read_remote(key, transfer.materialise)
        return default if value is None else value

    def get_into(self, key: Key, buffer: object) -> int | None:
        """Copy the value's bytes into ``buffer`` (any writable buffer); None on a miss.

        Returns:
            The number of bytes written (the value's length).

        Raises:
            InvalidArgument: ``buffer`` is not writable, not contiguous or too small.
        """
        try:
            target = memoryview(buffer).cast("B")  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidArgument(
                "get_into needs a writable, contiguous buffer (bytearray, numpy array)"
            ) from None
        if target.readonly:
            raise InvalidArgument("get_into needs a writable buffer, not a read-only one")

        def copy(header: bytes, payload: transfer.Payload) -> int:
            length = payload.nbytes
            if length > target.nbytes:
                raise InvalidArgument(
                    f"buffer of {target.nbytes} bytes is too small for the {length}-byte value"
                )
            payload.copy_into(target)
            return length

        self._gets_left -= 1
        if not self._gets_left:
            return self._timed(GET, self.get_into, key, buffer)
        length = self._read(key, copy)
        if length is None and self._below is not None:
            length = self._read_below(key, copy)
        if length is None and self._remote is not None:
            length = self._read_remote(key, copy)
        return length

    def __getitem__(self, key: Key) -> Value:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    @reports_damage
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a live value (no effect on stats or recency)."""
        if not isinstance(key, (str, bytes)):
            return False
        if self.in_local_tiers(key):
            return True
        return self._remote is not None and self._remote.exists([encode_key(key)[0]])[0]

    @reports_damage
    def in_local_tiers(self, key: Key) -> bool:
        """Whether ``key`` has a live value here or in a pool below, without asking the
        remote tier (``in`` asks it too: a round trip)."""
        key_bytes, _ = encode_key(key)
        with self._lock:
            eid = self._find(key_bytes)
            here = eid >= 0 and self._ed[eid * ENTRY_WORDS + E.expires_at] > self._clock()
        return here or (self._below is not None and self._contains_below(key))

    @reports_damage
    def note_asked(self, keys: Sequence[Key]) -> None:
        """Count ``keys`` as asked for, as a put of each would, without storing them: in the
        policy's frequency sketch (``prefix``; other policies keep none, and ignore it).
        ``PrefixCache.store`` notes the chunks after one the pool declined, which would be
        declined too (no parent), so that their counts grow as the simulation's do."""
        if self._sketch is None or not keys:
            return
        hashes = [key_hash(encode_key(key)[0]) for key in keys]
        with self._lock:
            for lo, hi in hashes:
                self._sketch.add(lo, hi)

    @reports_damage
    def __len__(self) -> int:
        with self._lock:
            num_live = self._hq[H.num_live]
        if not 0 <= num_live <= self.config.max_entries:  # len() would raise a ValueError
            raise damaged(self.name, f"live entry count {num_live}")
        # Across the chain; a key in the middle of a move counts twice for that moment.
        return num_live + (self._len_below() if self._below is not None else 0)

    @reports_damage
    def entries(self, sort: str = "lru", limit: int | None = None) -> list[EntryInfo]:
        """Live entries with their metadata, first the ones ``sort`` puts first.

        Args:
            sort: ``lru`` (least recently used first), ``size`` (largest first),
                ``priority`` (lowest first) or ``policy`` (the pool's next victims first).
            limit: at most this many.

        Raises:
            InvalidArgument: unknown sort or negative limit.
        """
        if sort not in ENTRY_SORTS:
            raise InvalidArgument(f"unknown sort {sort!r}: choose one of {', '.join(ENTRY_SORTS)}")
        if limit is not None:
            whole_number(limit, "limit")
        with self._lock:
            ids, records = self._live_records()
            if sort == "policy":
                order = rank_victims(self._policy, records, self._score_context())
            else:
                order = np.lexsort((records["last_access"], ENTRY_ORDERS[sort](records)))
            order = order[:limit]
            keys = [self._key_of(eid) for eid in ids[order].tolist()]
        return [
            EntryInfo.from_record(key, record)
            for key, record in zip(keys, records[order], strict=True)
        ]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    @reports_damage
    def stats(self) -> PoolStats:
        """Occupancy and counters as every attached process sees them."""
        with self._lock:
            h = self._hq
            self._add_kept_back()
            counters = {name: h[getattr(H, name)] for name in COUNTERS}
            counters.update((name, self._mq[getattr(M, name)]) for name in COUNTER_NAMES)
            used, num_live = h[H.used_pages] * self._page_size, h[H.num_live]
            attached = self._procs.live()  # under the lock: a close() may follow it at once
        here = me().pid_ns
        return PoolStats(
            name=self.name,
            policy=self.config.policy,
            size_bytes=self.config.size_bytes,
            used_bytes=used,
            free_bytes=self.config.size_bytes - used,
            page_size_bytes=self._page_size,
            num_entries=num_live,
            max_entries=self.config.max_entries,
            attached=tuple(who.pid for who in attached if who.pid_ns == here),
            num_attached=len(attached),
            **counters,
        )

    @reports_damage
    def metrics(self) -> PoolMetrics:
        """Latency histograms and PrefixCache token counters, as every process sees them
        (counters without a unit are in :meth:`stats`)."""
        with self._lock:
            self._add_kept_back()
            region = self._metrics.read()
            regret = self._regret.read()
        return PoolMetrics.from_region(self.name, self.tier, region, regret)

    @reports_damage
    def reset_stats(self) -> None:
        """Zero every counter and histogram of :meth:`stats`, :meth:`metrics` and
        :meth:`remote_stats`, for every process (``kvcache stats NAME --reset``)."""
        with self._lock:
            self._bytes_in = self._bytes_out = 0
            h = self._hq
            for name in (*COUNTERS, *(f"remote_{name}" for name in REMOTE_COUNTERS)):
                h[getattr(H, name)] = 0
            self._metrics.reset(self._clock())
            self._regret.reset()

    def count_error(self) -> None:
        """Count a cache failure an engine integration served around (a slot state the
        llama-server proxy could not restore or save): ``errors``, as refused puts are."""
        self._count_error()

    def _count_error(self) -> None:
        # closed, destroyed or damaged meanwhile: the caller's own error says more
        with contextlib.suppress(KVCacheError), self._lock:
            self._mq[M.errors] += 1

    @reports_damage
    def check(self, repair: bool = False) -> list[str]:
        """Recount every invariant and every entry's checksum; return what is wrong.

        An empty list means consistent. With ``repair=True`` the derived
        structures (free list, index, live list, counters) are rebuilt from the
        entry table, dropping entries that are half-written by dead processes or
        that point outside the pool, and entries whose bytes no longer match
        their checksum are removed.

        Entries are summed one at a time without the lock (the lock is taken
        only to find each one and to confirm it did not change meanwhile), so
        a check of a large pool never stalls the processes using it.
        """
        with self._lock:
            problems, sound = recovery.inspect(self._recovery_parts())
            if repair and problems:
                self._repair_after_crash()
        for eid in sound:
            key = self._verify_entry(eid, remove=repair)
            if key is not None:
                problems.append(f"entry {eid} (key {key!r}): its bytes do not match their checksum")
        return problems

    def _verify_entry(self, eid: int, *, remove: bool) -> Key | None:
        """The key of READY entry ``eid`` if its bytes fail their checksum (removed if asked)."""
        base = eid * ENTRY_WORDS
        with self._lock:
            if self._eq[base + E.state] != READY:
                return None  # gone since the ids were read
            generation, summed = self._eq[base + E.generation], self._summed(eid)
        if summed.intact():
            return None
        with self._lock:
            if self._eq[base + E.generation] != generation:
                return None  # replaced or removed meanwhile: what was summed is no more
            key = self._key_of(eid)
            if remove:
                self._drop_damaged(eid)
            return key

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Detach from the pool (which lives on until destroyed); idempotent.

        Waits for a call under the lock in another thread to finish; calls of
        other threads still waiting for the lock raise ``PoolClosedError``.
        """
        if self._closed:
            return
        self._closed = True
        _open_pools.discard(self)
        if self._below is not None:
            self._below.close()
        if self._remote is not None:
            self._remote.close()  # sends what is queued, for a bounded time
        self._close_access_log()
        try:
            if self._on_disk and not self._observing:
                self._close_cleanly()
            with self._lock.closing() as lock_fd:
                if self._bytes_in or self._bytes_out:
                    # after closing began, so that threads waiting for the lock are refused
                    # while this waits for another process's hold, as they were before
                    with file_lock_only(lock_fd):
                        self._add_kept_back()
                if self._slot >= 0:
                    self._procs.leave(lock_fd, self._slot)
        finally:
            self._lock = ClosedLock(self.name)  # type: ignore[assignment]
            self._allocator = self._entries = self._index = self._procs = None  # type: ignore[assignment]
            self._hq = self._hd = self._eq = self._ed = self._data = None  # type: ignore[assignment]
            self._metrics = self._mq = None  # type: ignore[assignment]
            self._latency = Latency(0, _discard_sample)  # its record holds the region's views
            self._views.release()
            self._segment.close()

    def flush(self) -> None:
        """Make what was stored so far durable: on a disk pool, write every changed page
        to the disk and wait (``msync`` + ``fsync``); on a pool in RAM, nothing to do.

        Without it a put reaches the disk at the last close, or when the kernel
        writes dirty pages back (``vm.dirty_expire_centisecs``, 30 s by default).

        Raises:
            PoolClosedError: the pool was closed here.
        """
        if self._closed:
            raise closed_error(self.name)
        if self._on_disk:
            self._segment.flush()

    def _close_cleanly(self) -> None:
        """The last handle of a disk pool flushes it and marks it clean (``kvcache.durable``)."""
        try:
            if self._procs.others_live(self._slot):
                return
            self._segment.flush()  # the bulk of it without the lock
            with self._lock:
                marked = durable.on_close(self._segment, self._hq, self._procs, self._slot)
            if marked:
                self._segment.flush_header()
        except (KVCacheError, OSError):
            pass  # destroyed, replaced, damaged or a failed write: unclean, the next open repairs

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            state = "closed" if self._closed else f"{len(self)} entries"
        except PoolDestroyedError:
            state = "destroyed or replaced"
        return f"<kvcache.Pool {self.name!r} {self.config.policy} {state}>"

    def _retire(self, how: int, take_name: Callable[[], None], *, force: bool) -> bool:
        """:func:`retire`'s part under the lock; False if the file lost its name meanwhile."""
        try:
            with self._lock:
                if not self._segment.has_its_name():
                    return False  # removed or replaced since it was opened: look it up again
                if not force:
                    self._refuse_if_others_attached("destroy" if how == DESTROYED else "replace")
                take_name()
                self._hq[H.retired] = how
                return True
        except PoolDestroyedError:
            return False  # another destroy or restore came first

    def _refuse_if_others_attached(self, verb: str) -> None:
        """Raise :class:`PoolBusyError` if processes other than this one have the pool open."""
        here = me()
        others = [who for who in self._procs.live() if who != here]
        if not others:
            return
        pids = [str(who.pid) for who in others if who.pid_ns == here.pid_ns]
        if len(pids) < len(others):  # their pids would name other processes here
            pids.append(f"{len(others) - len(pids)} in other PID namespaces")
        raise PoolBusyError(
            f"pool '{self.name}' is open in {len(others)} other process(es) "
            f"({', '.join(pids)}): close it there first, or pass --force (force=True) "
            f"to {verb} it anyway; their next call then fails with PoolDestroyedError"
        )

    def _after_fork(self) -> None:
        """In a forked child: own a lock description and a process slot of its own.

        The inherited description is the parent's: through it the child would
        share the parent's flock (no exclusion between the two) and its slot's
        lease (the parent's entries would look alive while the child runs).
        """
        self._lock.reopen_after_fork()
        self._bytes_in = self._bytes_out = 0  # what the parent kept back is the parent's
        if self._observing:
            return
        try:
            self._slot, self._serial = self._procs.claim(self._lock.fd)
        except PoolFullError:
            self._slot = -1  # reads still work; _reserve refuses writes with the reason

    # ------------------------------------ the two copy protocols (they take the lock)

    def _read(
        self,
        key: Key,
        copy: Callable[[bytes, transfer.Payload], Copied],
        *,
        count: bool = True,
    ) -> Copied | None:
        """Look ``key`` up here and ``copy`` its (codec header, payload views) out; None on a miss.

        ``count``: count the lookup in stats (a hit or a miss).

        Small values are copied under the lock. Larger ones are copied without
        it and kept only if the entry's generation did not change meanwhile
        (seqlock); a copy overtaken ``READ_ATTEMPTS`` times is a miss. With
        ``verify_reads`` the entry's bytes are summed too (outside the lock for
        large values): a mismatch drops the entry and is a miss. A disk pool
        reads large values from its file (``transfer.Payload``), small ones
        through the mapping, asking for their pages in one go.
        """
        try:
            key_bytes, _ = encode_key(key)
            if self._on_disk:
                self._segment.shed()
            for _ in range(READ_ATTEMPTS):
                with self._lock:
                    eid = self._lookup(key_bytes, count=count, read_ahead=self._on_disk)
                    if eid < 0:
                        return None
                    value_len = self._eq[eid * ENTRY_WORDS + E.value_len]
                    self._bytes_out += value_len if count else 0
                    inline = value_len <= INLINE_COPY_MAX_BYTES
                    header, payload, generation = self._value_views(eid, from_file=not inline)
                    checked = self._summed(eid, payload=False) if self.verify_reads else None
                    if self._on_disk:
                        # Even a value read from the file maps the pages of its key (in
                        # folios of up to a value's size, measured): counted the same.
                        self._segment.touched(value_len)
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
                with self._lock:
                    if self._eq[eid * ENTRY_WORDS + E.generation] == generation:
                        if intact:
                            return copied
                        self._drop_damaged(eid)
                        return None
                count = False  # the read is counted once, however often it is tried
            return None
        except DAMAGE_SIGNS as exc:  # inline, not @reports_damage: see raise_as_damage
            raise_as_damage(self.name, exc)

    def _store(
        self,
        key_bytes: bytes,
        flags: int,
        header_len: int,
        value_len: int,
        priority: int,
        expires_at: float,
        fill: Callable[[list[memoryview]], int | None],
        *,
        history: History | None = None,
        under_lock: bool = False,
        replace: bool = True,
        evict_within_reserved: bool = True,
        parent: bytes | None = None,
    ) -> bool:
        """Reserve an entry, let ``fill`` write its bytes, then publish it; False if fill refused
        (or ``_publish`` declined).

        ``fill`` returns the checksum of what it wrote (``transfer.checksum``),
        or None to refuse the entry.

        With ``under_lock`` (small values) it all happens in one lock hold.
        Otherwise the entry waits in state WRITING, invisible to readers and
        safe from eviction, while ``fill`` copies without the lock.
        ``history`` restores a snapshot entry's policy metadata; without
        ``replace`` an entry of the same key that appeared meanwhile stays (and
        this one is dropped); ``evict_within_reserved`` is ``_reserve``'s.
        """
        try:
            num_pages = -(-(len(key_bytes) + header_len + value_len) // self._page_size)
            if self._on_disk:  # a test, not two calls, on the RAM pools' hot path
                self._segment.touched(num_pages * self._page_size)
                self._segment.shed()
            if self._below is not None or self._demote_to is not None:
                self._spill(num_pages)
            with self._lock:
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
                    return self._finish(eid, checksum, history, replace, parent)
            try:
                checksum = fill(targets)
            except BaseException:
                with self._lock:
                    if self._eq[eid * ENTRY_WORDS + E.generation] == generation:
                        self._free_entry(eid)
                raise
            with self._lock:
                if self._eq[eid * ENTRY_WORDS + E.generation] != generation:
                    raise CorruptPoolError(
                        f"an entry of pool '{self.name}' was reclaimed while this live process "
                        f"wrote it: {REPAIR_ADVICE}"
                    )
                return self._finish(eid, checksum, history, replace, parent)
        except (PoolFullError, OutOfSharedMemoryError):
            self._count_error()
            raise
        except DAMAGE_SIGNS as exc:  # inline, not @reports_damage: see raise_as_damage
            raise_as_damage(self.name, exc)

    def _finish(
        self,
        eid: int,
        checksum: int | None,
        history: History | None,
        replace: bool,
        parent: bytes | None,
    ) -> bool:
        if checksum is None:
            self._free_entry(eid)
            return False
        self._eq[eid * ENTRY_WORDS + E.checksum] = transfer.as_word(checksum)
        return self._publish(eid, history, replace=replace, parent=parent)

    # ------------------------------------------- internals (lock held by caller)

    def _find(self, key_bytes: bytes, *, read_ahead: bool = False) -> int:
        """The READY entry holding exactly ``key_bytes``, or -1.

        ``read_ahead`` (a disk pool's get): ask for the entry's pages before its
        key is compared, so the key and the value arrive in one read.
        """
        eid = self._index.find(*key_hash(key_bytes))
        if eid < 0:
            return -1
        if read_ahead:
            self._read_ahead(eid)
        if self._stored_key(eid) != key_bytes:
            return -1  # a 128-bit hash collision: treat as absent
        return eid

    def _is_ready(self, eid: int, generation: int) -> bool:
        """Whether ``eid`` is still the READY entry it was when ``generation`` was read."""
        base = eid * ENTRY_WORDS
        return self._eq[base + E.generation] == generation and self._eq[base + E.state] == READY

    def _key_of(self, eid: int) -> Key:
        """The key of entry ``eid`` as it was given (for listings: checked, unlike lookups)."""
        base = eid * ENTRY_WORDS
        if not 0 <= self._eq[base + E.first_page] < self._num_pages:
            raise damaged(self.name, f"entry {eid}'s first page is outside the pool")
        key = bytes(self._key_view(eid))
        if not 0 < len(key) == self._eq[base + E.key_len]:
            raise damaged(self.name, f"entry {eid}'s key length is out of range")
        return key.decode("utf-8") if self._eq[base + E.flags] & KEY_IS_STR else key

    def _key_view(self, eid: int) -> memoryview:
        base = eid * ENTRY_WORDS
        start = self._eq[base + E.first_page] * self._page_size
        return self._data[start : start + self._eq[base + E.key_len]]

    def _key_from_file(self, eid: int) -> bytes:
        """A disk pool's ``_key_view``, read with ``pread``: a fault on a cold page of the
        mapping reads far more around it, under the lock (a cold 1 MiB get took 5.0 ms
        instead of 1.2; see docs/tiers.md, "Disk pools")."""
        base = eid * ENTRY_WORDS
        first, key_len = self._eq[base + E.first_page], self._eq[base + E.key_len]
        if not (0 <= first < self._num_pages and 0 < key_len <= MAX_KEY_BYTES):
            return b""  # damaged: matches no key (as a view past the pool's end would not)
        return os.pread(self._segment.fd, key_len, self._data_offset + first * self._page_size)

    def _lookup(self, key_bytes: bytes, *, count: bool, read_ahead: bool = False) -> int:
        """``_find``, dropping an expired entry, counting a hit or miss and touching on a hit."""
        eid = self._find(key_bytes, read_ahead=read_ahead)
        h = self._hq
        if eid >= 0:
            base = eid * ENTRY_WORDS
            expires_at = self._ed[base + E.expires_at]
            if expires_at != math.inf and expires_at <= self._clock():
                self._remove(eid)
                h[H.expirations] += 1
                eid = -1
        if not count:
            return eid
        if eid < 0:
            h[H.misses] += 1
            self._regret.request(*key_hash(key_bytes), self._clock())
            return -1
        h[H.hits] += 1
        clock = h[H.clock] + 1
        h[H.clock] = clock
        q, d = self._eq, self._ed
        if self._sketch is None:
            idle = clock - q[base + E.last_access]
            d[base + E.freq] = d[base + E.freq] * 2.0 ** (-idle / self.config.lfu_half_life) + 1.0
        else:  # the key's count over the sketch's longer history, this hit included
            d[base + E.freq] = self._sketch.add(q[base + E.hash_lo], q[base + E.hash_hi])
        q[base + E.last_access] = clock
        if self._queues is not None:
            cast(QueuePolicy, self._policy).hit(self._queues, eid)
        d[base + E.accessed_at] = self._clock()
        return eid

    def _value_views(
        self, eid: int, *, from_file: bool = False
    ) -> tuple[bytes, transfer.Payload, int]:
        """The value's codec header, its payload and its generation.

        ``from_file``: a disk pool's payload is read from its file, not the mapping.
        """
        q, base = self._eq, eid * ENTRY_WORDS
        key_len, header_len, value_len = (
            q[base + E.key_len],
            q[base + E.header_len],
            q[base + E.value_len],
        )
        runs = self._allocator.runs(q[base + E.first_page], q[base + E.num_pages])
        header = b"".join(self._slices(runs, key_len, header_len)) if header_len else b""
        spans = transfer.spans(self._page_size, runs, key_len + header_len, value_len)
        views = [self._data[offset : offset + n] for offset, n in spans]
        if not (from_file and self._on_disk):
            return header, transfer.Payload(views), q[base + E.generation]
        in_file = [(self._data_offset + offset, n) for offset, n in spans]
        return header, transfer.Payload(views, self._segment.fd, in_file), q[base + E.generation]

    def _read_ahead(self, eid: int) -> None:
        """Start reading a disk pool entry's pages in, in one go (see ``Segment.will_need``)."""
        for offset, length in self._file_spans(eid):
            self._segment.will_need(offset, length)

    def _file_spans(self, eid: int) -> list[tuple[int, int]]:
        """(offset, length) in the pool's file of each run of entry ``eid``'s pages."""
        q, base, page = self._eq, eid * ENTRY_WORDS, self._page_size
        runs = self._allocator.runs(q[base + E.first_page], q[base + E.num_pages])
        return [(self._data_offset + first * page, count * page) for first, count in runs]

    def _summed(self, eid: int, *, payload: bool = True) -> _Summed:
        """The entry's checksum and what it covers (``payload``: the value's bytes too)."""
        q, base = self._eq, eid * ENTRY_WORDS
        fields = (
            q[base + E.flags],
            q[base + E.key_len],
            q[base + E.header_len],
            q[base + E.value_len],
        )
        return _Summed(self._entry_slices(eid, payload=payload), fields, q[base + E.checksum])

    def _entry_slices(self, eid: int, *, payload: bool = True) -> list[memoryview]:
        """Views of an entry's bytes (key | value header | payload; without ``payload``: key |
        value header)."""
        q, base = self._eq, eid * ENTRY_WORDS
        runs = self._allocator.runs(q[base + E.first_page], q[base + E.num_pages])
        total = q[base + E.key_len] + q[base + E.header_len] + (q[base + E.value_len] * payload)
        return self._slices(runs, 0, total)

    def _live_records(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids and record copies of the live, unexpired entries."""
        ids = self._entries.live_ids()
        records = self._views.entries[ids]
        alive = records["expires_at"] > self._clock()
        return ids[alive], records[alive]

    def _slices(self, runs: list[Run], start: int, length: int) -> list[memoryview]:
        return transfer.slices(self._data, self._page_size, runs, start, length)

    def _reserve(
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
            fresh: a put, not a restore or promotion: where the policy keeps a
                frequency sketch, it counts the key, and a new key that makes
                the pool evict is admitted only if the policy says so (TinyLFU).
            parent: a chunk's parent key; a chunk whose parent is not here is
                declined, as ``_publish`` would decline it.
        """
        if self._observing:
            raise InvalidArgument(
                f"pool '{self.name}' was opened to observe, which may read but not store: "
                f"kvcache.open('{self.name}') without observe=True to store into it"
            )
        if self._slot < 0:
            raise PoolFullError(
                f"this process was forked while all {self.config.max_processes} process slots "
                f"of pool '{self.name}' were taken, so it may read but not write: "
                f"kvcache.open('{self.name}') again once others have closed it"
            )
        lo, hi = key_hash(key_bytes)
        new_key = fresh and self._index.find(lo, hi) < 0
        if new_key:
            self._regret.request(lo, hi, self._clock())
        if parent is not None and self._find(parent) < 0:
            if self._sketch is not None and fresh:
                self._sketch.add(lo, hi)  # asked for all the same
            return -1
        count = 1.0
        candidate = None
        recalled = -1
        if self._queues is not None and new_key:
            if cast(QueuePolicy, self._policy).recalls_before_evicting:
                recalled = self._recall(self._queues, lo)
            else:
                recalled = RECALL_AT_ADMIT
        if self._sketch is not None and fresh:
            count = candidate = float(self._sketch.add(lo, hi))
            if self._index.find(lo, hi) >= 0:
                candidate = None  # stored again: it was admitted before
        try:
            if not self._make_room(num_pages, candidate=candidate, recalled=recalled):
                return -1
        except PoolFullError:
            if (self._views.entries["state"] == WRITING).any():
                raise
            # Nothing left to evict and no one writing: the free counts are wrong.
            raise damaged(self.name, "no room, yet no entry is left to evict") from None
        try:
            first, last = self._allocator.allocate(num_pages)
        except OutOfSharedMemoryError:
            # The machine will not back more pages (a full /dev/shm, or the memory
            # check): fit the put into the pages the pool has, by evicting. Not for a
            # restore, whose report would overcount, nor for a value that cannot fit
            # them, for which evicting everything would be in vain.
            if not evict_within_reserved or num_pages > self._allocator.num_reserved():
                raise
            self._make_room(num_pages, within_reserved=True)
            first, last = self._allocator.allocate(num_pages)
        eid = self._entries.claim()
        q, d, base = self._eq, self._ed, eid * ENTRY_WORDS
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
        q[base + E.reads] = recalled if self._queues is not None else 0  # see _admit
        d[base + E.freq] = count  # a put is one access, or as many as the sketch counted
        d[base + E.expires_at] = expires_at
        q[base + E.owner_slot], q[base + E.owner_serial] = self._slot, self._serial
        q[base + E.state] = WRITING
        return eid

    def _publish(
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
        q, d, h, base = self._eq, self._ed, self._hq, eid * ENTRY_WORDS
        lo = q[base + E.hash_lo]
        old = self._index.find(lo, q[base + E.hash_hi])
        if old >= 0 and not replace:
            self._free_entry(eid)
            return False
        tree = self._tree
        if tree is not None and not self._place(tree, eid, old, parent):
            self._free_entry(eid)
            return False
        if self._queues is not None:
            self._admit(self._queues, eid, old, history)
        if old >= 0:
            self._remove(old)
        clock = h[H.clock] + 1
        h[H.clock] = clock
        created, last_access, freq = history or (clock, clock, d[base + E.freq])
        if history is not None and self._sketch is not None:  # snapshots keep no sketch
            self._sketch.raise_to(lo, q[base + E.hash_hi], freq)
        q[base + E.created] = created
        q[base + E.last_access] = last_access
        d[base + E.freq] = freq
        d[base + E.created_at] = d[base + E.accessed_at] = self._clock()
        q[base + E.state] = READY
        q[base + E.generation] += 1
        self._index.insert(eid, lo)
        self._entries.add_live(eid)
        h[H.puts] += 1
        self._bytes_in += q[base + E.value_len]
        expires_at = d[base + E.expires_at]
        if expires_at < self._hd[H.next_expiry_at]:
            self._hd[H.next_expiry_at] = expires_at
        return True

    def _place(self, tree: ChunkTree, eid: int, old: int, parent_key: bytes | None) -> bool:
        """Link a new chunk under its parent, taking over ``old``'s children; False if the
        parent is not here, or is the chunk itself or below it."""
        parent = -1 if parent_key is None else self._find(parent_key)
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
        q, base, policy = self._eq, eid * ENTRY_WORDS, cast(QueuePolicy, self._policy)
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
                recalled = self._recall(queues, q[base + E.hash_lo])
            policy.admit(queues, eid, recalled)

    def _recall(self, queues: Queues, lo: int) -> int:
        """Before a key not held is put: forget its ghost and tell the policy; the ghost's
        kind (``queues.PROBATION`` or ``MAIN``), or -1 if its key was no ghost."""
        kind = queues.ghosts.remove(lo)
        cast(QueuePolicy, self._policy).miss(queues, kind)
        return kind

    def _drop_damaged(self, eid: int) -> None:
        """Remove a READY entry whose bytes no longer match their checksum."""
        self._remove(eid)
        self._hq[H.damaged] += 1

    def _remove(self, eid: int) -> int:
        """Unindex a READY entry and free its pages and slot, and in a prefix-tracking pool its
        descendants' (unreachable without it), leaves first; how many entries went."""
        tree = self._tree
        if tree is None:
            self._unindex(eid)
            return 1
        doomed = [*tree.descendants(eid), eid]
        for each in doomed:
            tree.unlink(each)
            self._unindex(each)
        return len(doomed)

    def _unindex(self, eid: int) -> None:
        if self._queues is not None:
            self._queues.lists.unlink(eid)
        self._index.remove(eid, self._eq[eid * ENTRY_WORDS + E.hash_lo])
        self._entries.remove_live(eid)
        self._free_entry(eid)

    def _free_entry(self, eid: int) -> None:
        q, base = self._eq, eid * ENTRY_WORDS
        self._allocator.free(q[base + E.first_page], q[base + E.last_page], q[base + E.num_pages])
        self._entries.release(eid)

    # ------------- whole entries, for snapshots and tiers (see kvcache.stored; take the lock)

    @reports_damage
    def live_entries(self) -> tuple[int, np.ndarray, np.ndarray]:
        """The logical clock, and the ids and record copies (``layout.ENTRY_DTYPE``) of
        the live, unexpired entries; ``EntryRef(id, record["generation"])`` names one."""
        with self._lock:
            ids, records = self._live_records()
            return self._hq[H.clock], ids, records

    @reports_damage
    def read_entry(self, ref: EntryRef) -> tuple[StoredEntry, list[memoryview]] | None:
        """The metadata of entry ``ref`` and views of its bytes (key | value header |
        payload), or None if it is no longer that READY entry.

        The views are read without the lock: whatever was copied from them counts
        only if :meth:`confirm` says so afterwards.
        """
        with self._lock:
            if not self._is_ready(*ref):
                return None
            base = ref.eid * ENTRY_WORDS
            checksum = transfer.from_word(self._eq[base + E.checksum])
            record = self._views.entries[ref.eid]
            entry = StoredEntry.from_record(bytes(self._key_view(ref.eid)), record, checksum)
            return entry, self._entry_slices(ref.eid)

    @reports_damage
    def read_ahead(self, keys: Sequence[Key]) -> None:
        """Ask the disk for the entries of ``keys``, here and in the pools below, all at once,
        so that reads which follow one by one find them on their way (``PrefixCache.retrieve``
        before it reads its chunks). Nothing for pools in RAM; advice only: nothing counted.
        """
        if self._on_disk:
            hashes = [key_hash(encode_key(key)[0]) for key in keys]
            with self._lock:
                found = [self._index.find(lo, hi) for lo, hi in hashes]
                spans = [span for eid in found if eid >= 0 for span in self._file_spans(eid)]
            for offset, length in spans:  # each asks the disk: outside the lock
                self._segment.will_need(offset, length)
        if self._below is not None:
            self._below.call(lambda lower: lower.read_ahead(keys), None)

    @reports_damage
    def locate(self, key: Key) -> EntryRef | None:
        """The entry under ``key`` here, looked up as a read does (a hit or a miss in stats)."""
        key_bytes, _ = encode_key(key)
        with self._lock:
            eid = self._lookup(key_bytes, count=True, read_ahead=self._on_disk)
            if eid < 0:
                return None
            base = eid * ENTRY_WORDS
            self._bytes_out += self._eq[base + E.value_len]  # kept back, as a get's
            return EntryRef(eid, self._eq[base + E.generation])

    @reports_damage
    def remove_entry(self, ref: EntryRef) -> bool:
        """Remove entry ``ref`` if it is still that entry (moved elsewhere); whether it was."""
        with self._lock:
            if not self._is_ready(*ref):
                return False
            self._remove(ref.eid)
            return True

    @reports_damage
    def confirm(self, ref: EntryRef, entry: StoredEntry, views: list[memoryview]) -> bool:
        """Whether the bytes copied from ``views`` (:meth:`read_entry`'s) are entry ``ref``'s.

        False if the entry changed meanwhile; with ``verify_reads``, also if its
        bytes fail their checksum (summed here, without the lock), in which case
        the damaged entry is dropped and counted.
        """
        intact = not self.verify_reads or entry.checksum == transfer.checksum(
            views, entry.flags, len(entry.key), entry.header_len, entry.value_len
        )
        with self._lock:
            if not self._is_ready(*ref):
                return False
            if not intact:
                self._drop_damaged(ref.eid)
            return intact

    def write_entry(
        self,
        entry: StoredEntry,
        fill: Callable[[list[memoryview]], int | None],
        *,
        keep_history: bool = False,
        replace: bool = True,
        evict_within_reserved: bool = True,
    ) -> bool:
        """Store ``entry``, whose bytes ``fill`` copies into the views it is given.

        ``fill`` runs without this pool's lock and returns the checksum to publish
        (``entry.checksum`` for an intact copy), or None to refuse the entry.
        Returns whether the entry was published.

        Args:
            keep_history: keep ``entry``'s policy history (a restore on the
                snapshot's clock) rather than starting it afresh.
            replace: replace an entry of the same key; False leaves one that
                appeared meanwhile in place (a promotion never overwrites a newer put).
            evict_within_reserved: see ``_reserve``.

        Raises:
            ValueTooLargeError: the entry is larger than the whole pool.
        """
        self._refuse_too_large(entry.num_bytes)
        return self._store(
            entry.key,
            entry.flags,
            entry.header_len,
            entry.value_len,
            entry.priority,
            entry.expires_at,
            fill,
            history=(entry.created, entry.last_access, entry.freq) if keep_history else None,
            replace=replace,
            evict_within_reserved=evict_within_reserved,
        )

    @reports_damage
    def set_clock(self, clock: int) -> None:
        """Set the logical clock (a restore puts back the snapshot's)."""
        with self._lock:
            self._hq[H.clock] = clock

    @property
    def mode(self) -> int:
        """The pool file's permission bits."""
        return stat.S_IMODE(os.fstat(self._segment.fd).st_mode)

    def _recovery_parts(self) -> recovery.Parts:
        return recovery.Parts(
            self._views, self._allocator, self._entries, self._index, self._procs, self.config
        )

    def _repair_after_crash(self) -> None:
        """Rebuild the metadata from the entries (after a crash, or ``check(repair=True)``)."""
        recovery.rebuild(self._recovery_parts())
        self._metrics.repair()
        self._hq[H.repairs] += 1


def _discard_sample(op: int, ns: int) -> None:
    pass


def _reopen_locks_after_fork() -> None:
    for pool in list(_open_pools):
        pool._after_fork()


os.register_at_fork(after_in_child=_reopen_locks_after_fork)


def _close_disk_pools_at_exit() -> None:
    """An interpreter that exits normally without closing its disk pools leaves them clean
    (flushed and marked, so the next open needs no repair); shared-memory pools need nothing."""
    for pool in list(_open_pools):
        if pool._segment.on_disk:
            pool.close()


atexit.register(_close_disk_pools_at_exit)


def _copy_verified(
    copy: Callable[[bytes, transfer.Payload], Copied],
    header: bytes,
    payload: transfer.Payload,
    checked: _Summed,
) -> Copied | None:
    """``copy`` the value out; None if ``checked`` finds its bytes damaged.

    A verified pool (``verify_reads``, every disk pool) treats a codec header
    that cannot be decoded as damage too, found before the sum could be: a
    miss, never an error (a disk pool copied while writers ran has such
    headers in pages whose writes never landed). Damage beyond the value (a
    truncated file) is still the pool's ``CorruptPoolError``.
    """
    try:
        copied = copy(header, payload)
    except DamagedValueError:
        return None
    return copied if checked.intact(payload.landed) else None
