"""The chain: a pool's own store and the tiers under it, composed top to bottom.

A ``Pool`` holds one ``Chain``: its ``Store`` (``kvcache.engine``), the lower
pool its header names (a ``tiers.Tier``, held by ``tiers.Below``) and the
remote (``remote.tier.RemoteTier``). The chain owns the moves between them:

- A put that needs room first *spills*: the store picks victims by the pool's
  policy under its lock (``engine.whole.victims_to_move``), then, without the lock,
  each one is copied into the lower pool (key, value, ttl and priority travel;
  policy history starts afresh there), or at the bottom of the chain queued
  for the remote, and removed here only if it is still that entry. Whatever
  room spilling did not make, the ordinary eviction makes by dropping.
- A get that misses here reads below; with promote-on-hit (the default) the
  entry is first copied up (``replace=False``: never over a newer put), then
  removed below. A get that misses every local tier asks the remote and
  promotes what it finds. A put removes its key from the tiers below and the
  remote (or, with write-through, sends it there), so that a value overwritten
  here can never resurface from below once the new one is evicted.
- ``in``, ``keys``, ``len``, ``delete``, ``touch``, ``ttl``, ``pop`` and
  ``clear`` see the local tiers of the whole chain (``in`` and ``delete`` the
  remote too: listing or clearing a namespace other hosts share is an
  operator's decision, not a cache call); ``entries``, ``stats``, ``check``,
  ``evict`` and ``persist`` act on the pool alone.

Every move copies first and removes second, never holding two pools' locks
at once: a process killed mid-move leaves the entry in one tier or both
(identical), and its half-written copy is reclaimed like any dead writer's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import transfer
from .engine import Store, upkeep, whole
from .errors import OutOfSharedMemoryError, PoolFullError
from .keys import Key, encode_key
from .layout import PROMOTE_ON_HIT, H
from .remote import RemoteLink
from .remote.records import Decoded
from .remote.tier import RemoteTier, copy_out
from .stored import EntryRef, StoredEntry
from .tiers import Below, Tier
from .units import parse_duration

T = TypeVar("T")


class Chain:
    """The tiers under one pool's store: spill, promote and the chain-wide calls.

    A chain alone (nothing attached) holds only its store; ``attach_below`` and
    ``attach_remote`` add the tiers ``kvcache.opening`` finds in the pool's
    header and settings.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.name = store.name
        self._read = store.read
        self._promote = store.views.header_q[H.promote]
        self.below: Below | None = None
        self.remote: RemoteTier | None = None  # the top pool's: reads, write-through, deletes
        self.demote_to: RemoteTier | None = None  # the bottom pool's: where evictions go

    @property
    def reaches_further(self) -> bool:
        """Whether a read that misses the store, or a put, has tiers to go on to."""
        return self.below is not None or self.remote is not None

    def attach_below(self, below: Below) -> None:
        """Make ``below`` the lower pool: what the store evicts spills there first."""
        self.below = below
        self.store.spill = self.spill

    def attach_remote(self, link: RemoteLink, *, top: bool, bottom: bool) -> None:
        """Give this chain its part of ``link``: the remote it reads and writes through
        (``top``: the pool a caller opened) and where its evicted entries go (``bottom``:
        the chain's last local pool, unless the remote has every put already)."""
        if top:
            self.remote = RemoteTier(link, self.store.clock)
        if bottom and not link.spec.write_through:
            self.demote_to = RemoteTier(link, self.store.clock)
            self.store.spill = self.spill

    @property
    def promote(self) -> str:
        """What a hit below does: ``"hit"`` moves the entry up, ``"never"`` reads it there."""
        return "hit" if self._promote == PROMOTE_ON_HIT else "never"

    # ------------------------------------------------------------- spilling

    def spill(self, num_pages: int) -> None:
        """Move victims down until ``num_pages`` pages and a slot are free (``Store.spill``)."""
        # An unlocked read of two counters: a hint only (the put evicts under the lock anyway).
        if whole.has_room(self.store, num_pages):
            return
        for ref in whole.victims_to_move(self.store, num_pages):
            self._spill_one(ref)

    def _spill_one(self, ref: EntryRef) -> None:
        """Move one victim to the lower pool, or to the remote at the bottom of the chain."""
        store = self.store
        read = whole.read_entry(store, ref)
        if read is None:
            return  # gone since it was chosen
        entry, views = read
        below, remote = self.below, self.demote_to
        if below is not None:
            fill = _copier(functools.partial(whole.confirm, store), ref, entry, views)
            moved = below.call(lambda lower: lower.write_entry(entry, fill), False)
        else:
            assert remote is not None
            moved = remote.demote(entry, views, lambda: whole.confirm(store, ref, entry, views))
        if not moved:
            return  # the put's eviction drops it instead
        if whole.remove_entry(store, ref, count_as=H.spills):
            return
        # replaced here while it moved: what went down is stale
        if below is not None:
            below.call(lambda lower: lower.delete(entry.key), False)
        elif remote is not None:
            remote.delete(entry.key)

    # ---------------------------------------------------------------- reads

    def read_missed(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read that missed the store: the pools below, then the remote."""
        found = None if self.below is None else self._read_below(key, copy)
        if found is None and self.remote is not None:
            found = self._read_remote(key, copy)
        return found

    def read_chain(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read for the pool above: here, then below (``copy`` as for ``Store.read``)."""
        found: T | None = self._read(key, copy)
        if found is None and self.below is not None:
            return self._read_below(key, copy)
        return found

    def read_further_below(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read for the pool above whose own lookup here missed: from the pools below,
        promoting as this pool is configured to."""
        return None if self.below is None else self._read_below(key, copy)

    def _read_below(self, key: Key, copy: Callable[..., T]) -> T | None:
        """From below, promoting the entry here first if asked."""
        below = self.below
        assert below is not None
        if self._promote == PROMOTE_ON_HIT:
            moved = below.call(lambda lower: self._promote_from(lower, key), None)
            if moved:
                found: T | None = self._read(key, copy, count=False)
                if found is not None:
                    return found
            if moved is None:  # not in the lower pool itself (its miss is counted): further down
                return below.call(lambda lower: lower.read_further_below(key, copy), None)
        return below.call(lambda lower: lower.read_chain(key, copy), None)

    def _promote_from(self, lower: Tier, key: Key) -> bool | None:
        """Copy ``key``'s entry up from ``lower`` and remove it there: whether it moved,
        None if ``lower`` itself does not hold it."""
        ref = lower.locate(key)
        if ref is None:
            return None
        read = lower.read_entry(ref)
        if read is None:
            return False
        entry, views = read
        fill = _copier(lower.confirm, ref, entry, views)
        if not whole.write_entry(self.store, entry, fill, replace=False):
            return False
        upkeep.add_to_counters(self.store, {H.promotions: 1})
        lower.remove_entry(ref)
        return True

    def _read_remote(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read that missed every local tier: from the remote, promoted here."""
        assert self.remote is not None
        decoded = self.remote.read(encode_key(key)[0])
        if decoded is None:
            return None
        if self._promote_remote(decoded):
            found: T | None = self._read(key, copy, count=False)
            if found is not None:
                return found
        return copy_out(decoded, copy)  # not kept here (too large, no room now)

    def _promote_remote(self, decoded: Decoded) -> bool:
        """Store a verified remote entry here (never over a newer put); whether it was."""
        entry = decoded.entry

        def fill(targets: list[memoryview]) -> int:
            transfer.scatter(targets, tuple(decoded.views))
            return entry.checksum

        try:
            stored = whole.write_entry(self.store, entry, fill, replace=False)
        except (PoolFullError, OutOfSharedMemoryError):  # ValueTooLargeError is a PoolFullError
            return False
        if stored:
            upkeep.add_to_counters(self.store, {H.promotions: 1})
        return stored

    def read_ahead(self, keys: Sequence[Key]) -> None:
        """Ask the disk for the entries of ``keys`` in the pools below (advice only)."""
        if self.below is not None:
            self.below.call(lambda lower: lower.read_ahead(keys), None)

    # --------------------------------------------------------------- writes

    def after_put(
        self,
        key: Key,
        key_bytes: bytes,
        fields: tuple[int, int, int, int],
        priority: int,
        expires_at: float,
        checksum: int | None,
        pieces: tuple[Any, ...],
    ) -> None:
        """After a put here: the key leaves the tiers below (an older value there must
        never resurface) and is written through to the remote or removed there.

        ``fields`` are the entry's flags, key, header and value lengths; ``checksum`` is
        None if the put did not copy the value (a prefix pool declined it)."""
        if self.below is not None:
            self.forget_below(key)
        if self.remote is not None:
            if checksum is None:
                checksum = transfer.checksum(pieces, *fields)
            flags, _, header_len, value_len = fields
            entry = StoredEntry(
                key_bytes, flags, header_len, value_len, priority, expires_at, checksum
            )
            self.remote.after_put(entry, pieces)

    def delete_below(self, key: Key, key_bytes: bytes) -> bool:
        """Remove ``key`` from the tiers below and the remote; whether a pool below held it
        (the remote's answer is not waited for)."""
        below = self.forget_below(key)
        if self.remote is not None:
            self.remote.delete(key_bytes)
        return below

    def forget_below(self, key: Key) -> bool:
        """Remove ``key`` from every pool below; whether any held it."""
        return self.below is not None and self.below.call(lambda p: p.delete(key), False)

    # ------------------------------------------------- chain-wide mapping calls

    def in_local_tiers(self, key: Key) -> bool:
        """Whether ``key`` has a live value here or in a pool below (not the remote)."""
        if self.store.contains(encode_key(key)[0]):
            return True
        return self.below is not None and self.below.call(lambda p: key in p, False)

    def contains(self, key: Key) -> bool:
        """Whether ``key`` has a live value here, below or in the remote (a round trip)."""
        if self.in_local_tiers(key):
            return True
        return self.remote is not None and self.remote.exists([encode_key(key)[0]])[0]

    def num_below(self) -> int:
        """The number of live entries in the pools below."""
        return 0 if self.below is None else self.below.call(len, 0)

    def keys(self) -> list[Key]:
        """The keys live now here and in the pools below, each once."""
        keys = upkeep.keys(self.store)
        if self.below is not None:
            here = set(keys)
            none: list[Key] = []
            below = self.below.call(lambda p: list(p.keys()), none)
            keys.extend(key for key in below if key not in here)
        return keys

    def touch(self, key: Key, ttl: float | str | None) -> bool:
        """Give ``key`` a new expiry in whichever tier holds it (None: that pool's default)."""
        config = self.store.config
        ttl_s = config.default_ttl_s if ttl is None else parse_duration(ttl, what="ttl")
        if upkeep.touch(self.store, key, ttl_s):
            return True
        return self.below is not None and self.below.call(lambda p: p.touch(key, ttl), False)

    def ttl(self, key: Key) -> float | None:
        """Seconds until ``key`` expires in whichever tier holds it, None if never.

        Raises:
            KeyError: no tier holds a live entry for ``key``.
        """
        expires_at = upkeep.expiry(self.store, key)
        now = self.store.clock()
        if expires_at > now:
            return None if expires_at == math.inf else expires_at - now
        none: list[float | None] = []
        left = (
            none
            if self.below is None
            else self.below.call(lambda p: [p.ttl(key)] if key in p else none, none)
        )
        if not left:
            raise KeyError(key)
        return left[0]

    def clear(self) -> int:
        """Remove every entry of every local tier; how many were removed."""
        removed = upkeep.clear(self.store)
        return removed + (0 if self.below is None else self.below.call(lambda p: p.clear(), 0))

    def pop(self, key: Key) -> object | None:
        """Remove ``key`` from every local tier and return its value (None on a miss): the
        value here (see ``upkeep.take``), or else the one below."""
        value = upkeep.take(self.store, key)
        if self.below is not None:
            if value is None:
                value = self.below.call(lambda p: p.pop(key, None), None)
            else:
                self.forget_below(key)
        return value

    def popitem(self) -> tuple[Key, Any]:
        """Remove and return some (key, value) pair, from here first, then from below.

        Raises:
            KeyError: every local tier is empty.
        """
        while (key := upkeep.any_key(self.store)) is not None:
            value = self.pop(key)
            if value is not None:
                return key, value  # else gone meanwhile, or expired: take another
        none: list[tuple[Key, Any]] = []
        item = (
            none
            if self.below is None
            else self.below.call(lambda p: [p.popitem()] if len(p) else none, none)
        )
        if not item:
            raise KeyError("popitem(): the pool is empty")
        return item[0]

    # --------------------------------------------------------------- remote

    def count_present(self, keys: Sequence[Key]) -> int:
        """How many of ``keys``, from the first, are here, below or in the remote (the keys
        missing locally asked about in one pipelined round trip)."""
        missing = self._missing_locally(keys)
        if self.remote is None or not missing:
            return missing[0] if missing else len(keys)
        found = self.remote.exists([encode_key(keys[i])[0] for i in missing])
        return next((i for i, there in zip(missing, found, strict=True) if not there), len(keys))

    def prefetch(self, keys: Sequence[Key]) -> int:
        """Fetch the entries of ``keys`` missing locally from the remote in one round trip
        and promote them here, up to the first one neither has; how many came."""
        if self.remote is None:
            return 0
        missing = self._missing_locally(keys)
        promoted = 0
        for decoded in self.remote.fetch([encode_key(keys[i])[0] for i in missing]):
            if decoded is None or not self._promote_remote(decoded):
                break
            promoted += 1
        return promoted

    def _missing_locally(self, keys: Sequence[Key]) -> list[int]:
        """Positions of the keys no local tier holds (the remote's part of a prefix)."""
        return [i for i, key in enumerate(keys) if not self.in_local_tiers(key)]

    def close(self) -> None:
        """Close the pools below and the remote (which sends what is queued, for a bounded
        time); the store is the pool's to close."""
        if self.below is not None:
            self.below.close()
        if self.remote is not None:
            self.remote.link.close()


def _copier(
    confirm: Callable[[EntryRef, StoredEntry, list[memoryview]], bool],
    ref: EntryRef,
    entry: StoredEntry,
    views: list[memoryview],
) -> Callable[[list[memoryview]], int | None]:
    """A ``fill`` that copies ``views`` (entry ``ref`` of the tier it leaves) into another
    tier and publishes its checksum only if ``confirm`` says the bytes were that entry's."""

    def fill(targets: list[memoryview]) -> int | None:
        transfer.scatter(targets, tuple(views))
        return entry.checksum if confirm(ref, entry, views) else None

    return fill
