"""The Pool: the public face of a pool, over one engine and its chain of tiers.

A ``Pool`` holds the ``Store`` of its own segment (``kvcache.engine``: entries,
lock, eviction, repair) and the ``Chain`` of tiers under it (``kvcache.chain``:
lower pools it spills to and promotes from, and a remote). It turns keys and
values into encoded bytes, asks its store first and its chain on a miss, and
keeps the mapping conventions (``kvcache.mapping``), the latency sampling
(``kvcache.counters``) and the access log (``kvcache.settings``).

A ``put`` or ``get`` makes one call into the store, through a method bound
once at open, not a chain of delegations (each level would cost about 0.1 us,
2% of a 4 KiB get).
"""

from __future__ import annotations

import atexit
import math
import os
import time
import weakref
from collections import abc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar, cast, overload

import numpy as np

from . import codec, segment, transfer
from .accesslog import AccessLog, LogSpec
from .chain import Chain
from .config import PoolConfig
from .counters import GET, PUT, Latency, sample_every
from .engine import INLINE_COPY_MAX_BYTES, Store, closing, upkeep, whole
from .engine.store import Fill
from .engine.upkeep import ENTRY_SORTS
from .errors import (
    InvalidArgument,
    PoolDestroyedError,
    reports_damage,
)
from .keys import Key, encode_key
from .layout import PRIORITY_LIMIT, VALUE_IS_ARRAY, Geometry, H
from .lock import closed_error
from .mapping import NO_DEFAULT, Default, ItemsView, KeyList, Value, ValuesView
from .remote import RemoteLink
from .remote.tier import add_counts, read_counts
from .reports import EntryInfo, EvictionResult, PoolMetrics, PoolStats, RemoteStats
from .settings import FollowedLog, read_settings
from .stored import EntryRef, StoredEntry
from .tiers import Below
from .units import parse_duration

__all__ = ["ENTRY_SORTS", "INLINE_COPY_MAX_BYTES", "Pool"]

Timed = TypeVar("Timed")
Copied = TypeVar("Copied")

_open_pools: weakref.WeakSet[Pool] = weakref.WeakSet()


class Pool(abc.MutableMapping[Key, Value]):
    """A named KV-cache pool in shared memory; use :func:`create` or :func:`open`.

    Safe to share between threads; every process that opens the same name sees
    the same entries and counters. A ``MutableMapping`` (``pool[key]``,
    ``key in pool``, ``len(pool)``, ``get``, ``pop``, ``items()``, ``update``,
    ...) and a context manager (``with`` closes it).

    It inherits from ``MutableMapping`` rather than registering with it, so
    that type checkers accept a pool where a mapping is expected; every mixin
    method that would copy the whole pool, or race with other processes, is
    overridden (``clear``, ``pop``, ``popitem``, the views in
    ``kvcache.mapping``, ``==``).
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
        verify_reads: bool | None = None,
        observe: bool = False,
        clock: Callable[[], float] = time.time,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.name = seg.name
        self.config = config
        self._segment = seg
        self._closed = False
        self._clock = clock
        engine = self._engine = Store(
            seg,
            config,
            geometry,
            verify_reads=verify_reads,
            observe=observe,
            clock=clock,
            rng=rng if rng is not None else np.random.default_rng(),
        )
        self.verify_reads = engine.verify_reads
        # kvcache.opening attaches the tiers the header and settings name
        self._chain = Chain(engine)
        self._chained = False  # whether a miss or a put goes on to the chain: one test
        # bound once: put and get make one call into the engine, not two
        self._read, self._write, self._put_small = engine.read, engine.write, engine.put_small
        self._max_bytes = engine.max_bytes
        self._tracks_prefixes = engine.table.tree is not None
        self._latency = Latency(sample_every(), engine.add_sample)
        self._gets_left = self._puts_left = self._latency.every
        header_q = engine.views.header_q
        self._access_log = FollowedLog(
            seg,
            self.name,
            lambda: header_q[H.settings_serial],
            lambda: upkeep.add_to_counters(engine, {H.settings_serial: 1}),
        )
        _open_pools.add(self)

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

    @property
    def tier(self) -> str:
        """``disk`` if the pool's file is on a disk, ``cpu`` if it is in RAM (shared memory)."""
        return "disk" if self._engine.on_disk else "cpu"

    @property
    def latency(self) -> Latency:
        """This process's latency sampler for the pool (``kvcache.counters``): ``put`` and
        ``get`` time themselves with it, ``PrefixCache`` its ``lookup`` and ``retrieve``."""
        return self._latency

    def count_tokens(self, model: str, *, queried: int = 0, hit: int = 0, stored: int = 0) -> None:
        """Add to the token counters of ``model`` (a PrefixCache's; see :meth:`metrics`)."""
        self._engine.metrics.count_tokens(model, queried, hit, stored)

    @property
    def path(self) -> Path:
        """The pool's file."""
        return self._segment.path

    @property
    def lower(self) -> Pool | None:
        """The lower pool, open, or None (no chain, or the lower pool is missing)."""
        # kvcache.opening opens every tier below a pool as a Pool
        below = self._chain.below
        return None if below is None else cast("Pool | None", below.pool)

    def chain(self) -> Iterator[Pool]:
        """This pool and every open pool below it, top first."""
        tier: Pool | None = self
        while tier is not None:
            yield tier
            tier = tier.lower

    @property
    def access_log(self) -> AccessLog | None:
        """The access log this pool writes to now, or None (one header word read per call)."""
        return self._access_log.current()

    def set_access_log(
        self, path: str | os.PathLike[str] | None, max_size: str | int | None = None
    ) -> LogSpec | None:
        """Start logging this pool's prefix requests to ``path`` (None: stop), for every
        process that uses it; ``max_size`` caps the log with its rotated file (default 64M).

        Raises:
            InvalidArgument: a bad size, a file that cannot be written, or a pool of
                another user (only its owner may set its log).
        """
        return self._access_log.switch(path, max_size)

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
        if type(value) is bytes:  # the common value, as codec.encode takes it: 0.2 us less
            is_array, header, payload = False, b"", memoryview(value)
        else:
            is_array, header, payload = codec.encode(value, self._max_bytes - len(key_bytes))
        # Inline rather than units.whole_number: this is the put path (saves ~0.2 us).
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or abs(priority) >= PRIORITY_LIMIT
        ):
            raise InvalidArgument(f"priority must be a whole number, not {priority!r}")
        ttl_s = self.config.default_ttl_s if ttl is None else parse_duration(ttl, what="ttl")
        parent_bytes = (
            None if parent is None or not self._tracks_prefixes else encode_key(parent)[0]
        )
        expires_at = self._clock() + ttl_s if ttl_s else math.inf
        total = len(key_bytes) + len(header) + payload.nbytes
        if total > self._max_bytes:
            self._engine.refuse_too_large(total)
        flags |= VALUE_IS_ARRAY if is_array else 0
        # copied under the lock as a read of it would be: a payload of up to 64 KiB
        under_lock = payload.nbytes <= INLINE_COPY_MAX_BYTES
        checksum = (  # in one compiled call where it can (a free slot and pages, no queues)
            self._put_small(key_bytes, flags, header, payload, priority, expires_at, parent_bytes)
            if under_lock
            else None
        )
        if checksum is not None and not self._chained:
            return
        pieces = (key_bytes, header, payload)
        fields = (flags, len(key_bytes), len(header), payload.nbytes)
        if checksum is None:
            checksum = self._put_python(
                pieces, fields, priority, expires_at, under_lock, parent_bytes
            )
        if self._chained:
            self._chain.after_put(key, key_bytes, fields, priority, expires_at, checksum, pieces)

    def _put_python(
        self,
        pieces: tuple[bytes, bytes, memoryview],
        fields: tuple[int, int, int, int],
        priority: int,
        expires_at: float,
        under_lock: bool,
        parent: bytes | None,
    ) -> int | None:
        """``put``'s write where the compiled one left it (or is not built); the checksum."""
        # A small value is summed before the lock is taken, so no lock hold grows by it; a
        # large one is summed as it is copied, without the lock (transfer.scatter_summed).
        checksum = transfer.checksum(pieces, *fields) if under_lock else None

        def fill(targets: list[memoryview]) -> int:
            nonlocal checksum
            if checksum is not None:
                transfer.scatter(targets, pieces)
                return checksum
            checksum = transfer.scatter_summed(targets, pieces, fields)
            return checksum

        flags, _, header_len, value_len = fields
        self._write(
            pieces[0],
            flags,
            header_len,
            value_len,
            priority,
            expires_at,
            fill,
            under_lock=under_lock,
            parent=parent,
        )
        return checksum

    def __setitem__(self, key: Key, value: Value) -> None:
        self.put(key, value)

    @reports_damage
    def delete(self, key: Key) -> bool:
        """Remove ``key``; return whether it was there."""
        key_bytes, _ = encode_key(key)
        here = self._engine.delete(key_bytes)
        below = self._chained and self._chain.delete_below(key, key_bytes)
        return here or below

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
        if value is None and self._chained:
            value = self._chain.read_missed(key, transfer.materialise)
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
        length = self._read(key, copy, into=target)
        if length is None and self._chained:
            length = self._chain.read_missed(key, copy)
        return length

    def __getitem__(self, key: Key) -> Value:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    @reports_damage
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a live value (no effect on stats or recency)."""
        return isinstance(key, (str, bytes)) and self._chain.contains(key)

    @reports_damage
    def in_local_tiers(self, key: Key) -> bool:
        """Whether ``key`` has a live value here or in a pool below, without asking the
        remote tier (``in`` asks it too: a round trip)."""
        return self._chain.in_local_tiers(key)

    @reports_damage
    def __len__(self) -> int:
        # Across the chain; a key in the middle of a move counts twice for that moment.
        return upkeep.num_live(self._engine) + self._chain.num_below()

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
        return upkeep.entries(self._engine, sort, limit)

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys())

    # ------------------------------------------ the mapping's rest, chain-wide

    @reports_damage
    def keys(self) -> KeyList[Key]:  # type: ignore[override]  # a list and a set, see KeyList
        """The keys of all live (unexpired) entries now, here and in the pools below, each
        once, in no particular order."""
        return KeyList(self._chain.keys())

    def items(self) -> ItemsView[Key, Value]:
        """(key, value) pairs of the keys live now, each value read when iteration reaches it.

        No lock is held while the caller iterates and values are not copied up
        front; a key removed meanwhile is skipped. Each value is read as by
        ``get`` (a hit in ``stats``, and recency for the policy).
        """
        return ItemsView(self)

    def values(self) -> ValuesView[Value]:
        """The values of the keys live now, read one by one as ``items()`` reads them."""
        return ValuesView(self)

    @overload
    def pop(self, key: Key) -> Value: ...
    @overload
    def pop(self, key: Key, default: Default) -> Value | Default: ...
    @reports_damage
    def pop(self, key: Key, default: object = NO_DEFAULT) -> object:
        """Remove ``key`` from every tier and return its value; ``default`` on a miss,
        KeyError without one.

        The value returned is the one removed: the entry's generation is noted
        before the copy and the entry is removed only if it is unchanged after
        it, so a value another process puts meanwhile is neither returned
        unremoved nor removed unreturned. Counted in stats as a read (a hit or
        a miss); an entry overtaken ``READ_ATTEMPTS`` times is a miss.
        """
        value = self._chain.pop(key)
        if value is not None:
            return value
        if default is NO_DEFAULT:
            raise KeyError(key)
        return default

    @reports_damage
    def popitem(self) -> tuple[Key, Value]:
        """Remove and return some (key, value) pair, from this pool first, then from below;
        KeyError when the pool is empty.

        Which pair is unspecified. Overrides the mixin, which lists every key
        first and takes a key another process removed meanwhile for an empty pool.
        """
        return self._chain.popitem()

    @reports_damage
    def clear(self) -> int:  # type: ignore[override]  # also returns the count, as diskcache's
        """Remove every entry of every tier; return how many were removed.

        Removes the entries there when it starts (a value put meanwhile may
        survive), ``engine.eviction.EVICT_BATCH`` per lock hold, like ``evict``, so that other
        processes are never stalled for the whole pool. Like ``delete``, and
        unlike eviction and expiry, it is not counted in ``stats``.
        """
        return self._chain.clear()

    @reports_damage
    def touch(self, key: Key, ttl: float | str | None = None) -> bool:
        """Give ``key`` a new expiry in whichever tier holds it, keeping its value; return
        whether it was there.

        Args:
            ttl: as for ``put``: seconds (or ``"10m"``) from now; None for the
                pool's ``default_ttl_s``, which on a pool without one means
                never (as diskcache's ``touch(key, expire=None)``).

        Raises:
            InvalidArgument: bad key or ttl.
        """
        return self._chain.touch(key, ttl)

    @reports_damage
    def ttl(self, key: Key) -> float | None:
        """Seconds until ``key`` expires (from whichever tier holds it), or None if it never
        does (no effect on stats).

        Raises:
            KeyError: no live entry for ``key`` (like ``pool[key]``); a None
                here would read as "never expires".
        """
        return self._chain.ttl(key)

    # ------------------------------------------------------------ the chain

    def attach_below(self, below: Below) -> None:
        """Make ``below`` the lower pool: what this pool evicts spills there first."""
        self._chain.attach_below(below)
        self._chained = self._chain.reaches_further

    def attach_remote(self, link: RemoteLink, *, top: bool, bottom: bool) -> None:
        """Give this pool its part of its chain's remote ``link``: read and write through it
        (``top``: the pool a caller opened), demote what it evicts to it (``bottom``)."""
        self._chain.attach_remote(link, top=top, bottom=bottom)
        self._chained = self._chain.reaches_further

    @property
    def spill_to(self) -> str | None:
        """The name of the lower pool evicted entries move to, or None."""
        below = self._chain.below
        return None if below is None else below.name

    @property
    def promote(self) -> str:
        """What a hit below does: ``"hit"`` moves the entry up here, ``"never"`` reads it there."""
        return self._chain.promote

    @property
    def lower_problem(self) -> str | None:
        """Why the lower pool named in the header is not open now (None if it is, or none)."""
        below = self._chain.below
        if below is None or below.pool is not None:
            return None
        return below.problem or "not open"

    def read_chain(self, key: Key, copy: Callable[..., Copied]) -> Copied | None:
        """A read for the pool above: here, then below (``copy`` as for ``Store.read``)."""
        return self._chain.read_chain(key, copy)

    def read_further_below(self, key: Key, copy: Callable[..., Copied]) -> Copied | None:
        """A read for the pool above, whose own lookup here missed: from the pools below
        this one, promoting as this pool is configured to."""
        return self._chain.read_further_below(key, copy)

    # ----------------------------------------------------------- the remote

    @property
    def remote(self) -> RemoteLink | None:
        """This pool's remote tier, or None."""
        remote = self._chain.remote
        return None if remote is None else remote.link

    def remote_stats(self) -> RemoteStats | None:
        """The remote tier's place, state and counters; None without one."""
        remote = self._chain.remote
        if remote is None:
            return None
        remote.link.settle()  # this process's counts so far
        return remote.stats(read_counts(self._engine))

    def remote_counts(self) -> dict[str, int] | None:
        """The remote tier's counters (``layout.REMOTE_COUNTERS``) from the header, without
        a call to the remote (a pool opened with ``chain=False`` has them too); None if the
        pool names no remote."""
        remote = self._chain.remote
        if remote is not None:
            remote.link.settle()
        elif read_settings(self._segment.path, self.name).remote is None:
            return None
        return read_counts(self._engine)

    def count_remote(self, deltas: dict[str, int]) -> None:
        """Add to the remote counters in the header: the sink of the ``RemoteLink`` that
        ``kvcache.opening`` makes for this pool (called from any thread; never raises)."""
        add_counts(self._engine, deltas)

    def count_present(self, keys: Sequence[Key]) -> int:
        """How many of ``keys``, from the first, are in this pool, its chain or its remote.

        The keys missing locally are asked about in one pipelined round trip to
        the remote, not one each (``PrefixCache.lookup``).
        """
        return self._chain.count_present(keys)

    def prefetch(self, keys: Sequence[Key]) -> int:
        """Fetch the entries of ``keys`` missing locally from the remote, in one pipelined
        round trip, and promote them here, stopping at the first one neither has; return
        how many came (``PrefixCache.retrieve`` then reads them all locally)."""
        return self._chain.prefetch(keys)

    @reports_damage
    def stats(self) -> PoolStats:
        """Occupancy and counters as every attached process sees them."""
        return upkeep.stats(self._engine)

    @reports_damage
    def metrics(self) -> PoolMetrics:
        """Latency histograms and PrefixCache token counters, as every process sees them
        (counters without a unit are in :meth:`stats`)."""
        return upkeep.metrics(self._engine, self.tier)

    @reports_damage
    def reset_stats(self) -> None:
        """Zero every counter and histogram of :meth:`stats`, :meth:`metrics` and
        :meth:`remote_stats`, for every process (``kvcache stats NAME --reset``)."""
        upkeep.reset_stats(self._engine)

    def count_error(self) -> None:
        """Count a cache failure an engine integration served around (a slot state the
        llama-server proxy could not restore or save): ``errors``, as refused puts are."""
        self._engine.count_error()

    @reports_damage
    def evict(
        self, *, percent: float | None = None, bytes: str | int | None = None, expired: bool = False
    ) -> EvictionResult:
        """Evict by the pool's policy, expired entries first.

        Give exactly one of: ``percent`` of the used bytes to free (0-100],
        ``bytes`` to free (``"100M"``), or ``expired=True`` to drop only expired
        entries. Unlike the sampling done on put, this ranks every entry.

        Raises:
            InvalidArgument: none or several targets, or a bad percent or size.
        """
        return upkeep.evict(self._engine, percent=percent, bytes=bytes, expired=expired)

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
        return upkeep.check(self._engine, repair)

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
        self._chain.close()
        self._access_log.close()
        try:
            closing.close(self._engine)
        finally:
            self._latency = Latency(0, _discard_sample)  # its record holds the region's views

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
        if self._engine.on_disk:
            self._segment.flush()

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
        return upkeep.retire(self._engine, how, take_name, force=force)

    def _refuse_if_others_attached(self, verb: str) -> None:
        """Raise :class:`PoolBusyError` if processes other than this one have the pool open."""
        upkeep.refuse_if_others_attached(self._engine, verb)

    def _after_fork(self) -> None:
        """In a forked child: a lock description and a process slot of its own."""
        closing.after_fork(self._engine)

    # ---- whole entries, for snapshots and the chain above (see kvcache.engine.whole)

    def live_entries(self) -> tuple[int, np.ndarray, np.ndarray]:
        """The logical clock, and the ids and record copies (``layout.ENTRY_DTYPE``) of
        the live, unexpired entries; ``EntryRef(id, record["generation"])`` names one."""
        return whole.live_entries(
            self._engine,
        )

    def read_entry(self, ref: EntryRef) -> tuple[StoredEntry, list[memoryview]] | None:
        """The metadata of entry ``ref`` and views of its bytes (key | value header |
        payload), or None if it is no longer that READY entry; what is copied from the
        views counts only if :meth:`confirm` says so afterwards."""
        return whole.read_entry(self._engine, ref)

    @reports_damage
    def read_ahead(self, keys: Sequence[Key]) -> None:
        """Ask the disk for the entries of ``keys``, here and in the pools below, all at once,
        so that reads which follow one by one find them on their way (``PrefixCache.retrieve``
        before it reads its chunks). Nothing for pools in RAM; advice only: nothing counted.
        """
        whole.read_ahead(self._engine, keys)
        self._chain.read_ahead(keys)

    def locate(self, key: Key) -> EntryRef | None:
        """The entry under ``key`` here, looked up as a read does (a hit or a miss in stats)."""
        return whole.locate(self._engine, key)

    def remove_entry(self, ref: EntryRef) -> bool:
        """Remove entry ``ref`` if it is still that entry (moved elsewhere); whether it was."""
        return whole.remove_entry(self._engine, ref)

    def confirm(self, ref: EntryRef, entry: StoredEntry, views: list[memoryview]) -> bool:
        """Whether the bytes copied from ``views`` (:meth:`read_entry`'s) are entry ``ref``'s:
        False if it changed meanwhile or its bytes fail their checksum (where this handle
        verifies such a value on read)."""
        return whole.confirm(self._engine, ref, entry, views)

    def write_entry(
        self,
        entry: StoredEntry,
        fill: Fill,
        *,
        keep_history: bool = False,
        replace: bool = True,
        evict_within_reserved: bool = True,
    ) -> bool:
        """Store ``entry``, whose bytes ``fill`` copies into the views it is given; whether it
        was published (a snapshot's restore, a move between tiers).

        ``fill`` runs without this pool's lock and returns the checksum to publish, or None
        to refuse the entry. ``keep_history`` keeps the entry's policy history, ``replace``
        False leaves an entry of the same key that appeared meanwhile, and
        ``evict_within_reserved`` is as for ``put``: see ``kvcache.engine.whole.write_entry``.

        Raises:
            ValueTooLargeError: the entry is larger than the whole pool.
        """
        return whole.write_entry(
            self._engine,
            entry,
            fill,
            keep_history=keep_history,
            replace=replace,
            evict_within_reserved=evict_within_reserved,
        )

    def set_clock(self, clock: int) -> None:
        """Set the logical clock (a restore puts back the snapshot's)."""
        whole.set_clock(self._engine, clock)

    @property
    def mode(self) -> int:
        """The pool file's permission bits."""
        return self._engine.mode


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
