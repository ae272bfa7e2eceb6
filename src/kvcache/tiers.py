"""Chains of pools: evicted entries spill to a lower pool, hits below are promoted.

A pool may name a lower pool (``create(..., spill_to=NAME)``, kept in its
header, so every process that opens it follows the same chain to any depth).
``TierMixin`` is the chain's half of ``Pool``:

- A put that needs room first *spills*: its store picks victims by the pool's
  policy under its lock (``Store.victims_to_move``), then, without the lock,
  copies each one into the lower pool
  (``Pool.write_entry``: key, value, ttl and priority travel; policy history
  starts afresh there) and removes it here only if it is still that entry.
  Whatever room spilling did not make, the ordinary eviction makes by dropping.
- A get that misses here reads below; with promote-on-hit (the default) the
  entry is first copied up (``replace=False``: never over a newer put), then
  removed below. A put removes its key from the tiers below, so that a value
  overwritten here can never resurface from below once the new one is evicted.
- ``in``, ``keys``, ``len``, ``delete``, ``touch``, ``ttl`` and ``clear`` see the
  whole chain; ``entries``, ``stats``, ``check``, ``evict`` and ``persist`` act
  on this pool alone.

Every move copies first and removes second, never holding two pools' locks
at once: a process killed mid-move leaves the entry in one tier or both
(identical), and its half-written copy is reclaimed like any dead writer's.
A lower pool that is missing, destroyed or broken is a miss (the chain is cut
and tried again every ``REOPEN_INTERVAL_S``), never an error for the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from . import transfer
from .engine import upkeep
from .errors import (
    KVCacheError,
    OutOfSharedMemoryError,
    PoolFullError,
    PoolNotFoundError,
    ValueTooLargeError,
)
from .keys import Key
from .layout import PROMOTE_ON_HIT, H
from .mapping import _NO_DEFAULT, Default, KeyList, MappingMixin, Value
from .stored import EntryRef, StoredEntry

if TYPE_CHECKING:
    from .engine import Store

T = TypeVar("T")
REOPEN_INTERVAL_S = 5.0
"""A lower pool that could not be opened (or went away) is looked for again this often."""

log = logging.getLogger(__name__)


class Tier(Protocol):
    """A pool below another in a chain, as the pool above uses it: whole entries out and in
    (spill, promote), reads through the tiers further down, and the chain-wide mapping
    calls. ``Pool`` is one; nothing here names the class above."""

    name: str

    def locate(self, key: Key) -> EntryRef | None: ...
    def read_entry(self, ref: EntryRef) -> tuple[StoredEntry, list[memoryview]] | None: ...
    def confirm(self, ref: EntryRef, entry: StoredEntry, views: list[memoryview]) -> bool: ...
    def write_entry(
        self, entry: StoredEntry, fill: Callable[[list[memoryview]], int | None]
    ) -> bool: ...
    def remove_entry(self, ref: EntryRef) -> bool: ...
    def read_chain(self, key: Key, copy: Callable[..., T]) -> T | None: ...
    def read_further_below(self, key: Key, copy: Callable[..., T]) -> T | None: ...
    def read_ahead(self, keys: Sequence[Key]) -> None: ...
    def delete(self, key: Key) -> bool: ...
    def touch(self, key: Key, ttl: float | str | None = None) -> bool: ...
    def ttl(self, key: Key) -> float | None: ...
    def clear(self) -> int: ...
    def pop(self, key: Key, default: Any) -> Any: ...
    def popitem(self) -> tuple[Key, Value]: ...
    def keys(self) -> KeyList[Key]: ...
    def __contains__(self, key: object) -> bool: ...
    def __len__(self) -> int: ...
    def close(self) -> None: ...


class Below:
    """The open handle of a pool's lower tier, reopened by name when it goes away.

    ``opener`` opens the lower pool (and, through it, the rest of the chain);
    a failure to open it, or a kvcache error from it later other than a lack of
    room (destroyed, damaged, closed), cuts the chain for ``REOPEN_INTERVAL_S``:
    callers then see a miss, never the error.
    """

    def __init__(self, name: str, opener: Callable[[], Tier]) -> None:
        self.name = name
        self._opener = opener
        self._pool: Tier | None = None
        self._retry_at = 0.0
        self.problem: str | None = None  # why the chain is cut, for status
        self._get()

    def _get(self) -> Tier | None:
        if self._pool is None and time.monotonic() >= self._retry_at:
            try:
                self._pool = self._opener()
                self.problem = None
            except KVCacheError as exc:
                self._cut(exc)
        return self._pool

    def _cut(self, exc: Exception) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self.problem = str(exc)
        self._retry_at = time.monotonic() + REOPEN_INTERVAL_S
        # A missing lower pool is a state (status shows it); a failing one is news.
        level = logging.INFO if isinstance(exc, PoolNotFoundError) else logging.WARNING
        log.log(level, "lower pool '%s' is out of the chain for now: %s", self.name, exc)

    def call(self, action: Callable[[Tier], T], default: T) -> T:
        """``action(lower pool)``, or ``default`` if there is none or it fails."""
        pool = self._get()
        if pool is None:
            return default
        try:
            return action(pool)
        except (ValueTooLargeError, PoolFullError, OutOfSharedMemoryError):
            return default  # no room below for this one now: nothing wrong with the pool
        except KVCacheError as exc:
            self._cut(exc)
            return default

    @property
    def pool(self) -> Tier | None:
        """The open lower pool, if there is one now."""
        return self._get()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class TierMixin(MappingMixin):
    """Spill, promote and the chain-wide mapping operations of ``Pool``."""

    _below: Below | None
    _promote: int
    name: str
    _engine: Store

    # Pool's and RemoteMixin's, declared for the type checker
    _read: Callable[..., Any]
    write_entry: Callable[..., bool]
    _demote: Callable[..., bool]
    _demote_to: Any

    def attach_below(self, below: Below) -> None:
        """Make ``below`` the lower pool: what this pool evicts spills there first."""
        self._below = below
        self._engine.spill = self._spill

    @property
    def spill_to(self) -> str | None:
        """The name of the lower pool evicted entries move to, or None."""
        return None if self._below is None else self._below.name

    @property
    def promote(self) -> str:
        """What a hit below does: ``"hit"`` moves the entry up here, ``"never"`` reads it there."""
        return "hit" if self._promote == PROMOTE_ON_HIT else "never"

    @property
    def lower_problem(self) -> str | None:
        """Why the lower pool named in the header is not open now (None if it is, or none)."""
        if self._below is None or self._below.pool is not None:
            return None
        return self._below.problem or "not open"

    # ------------------------------------------------------------- spilling

    def _spill(self, num_pages: int) -> None:
        """Move victims to the lower pool until ``num_pages`` pages and a slot are free."""
        # An unlocked read of two counters: a hint only (the put evicts under the lock anyway).
        if self._engine.has_room(num_pages):
            return
        for ref in self._engine.victims_to_move(num_pages):
            self._spill_one(ref)

    def _spill_one(self, ref: EntryRef) -> None:
        """Move one victim to the lower pool, or to the remote at the bottom of the chain."""
        engine = self._engine
        read = engine.read_entry(ref)
        if read is None:
            return  # gone since it was chosen
        entry, views = read
        below = self._below
        if below is not None:

            def fill(targets: list[memoryview]) -> int | None:
                transfer.scatter(targets, tuple(views))
                return entry.checksum if engine.confirm(ref, entry, views) else None

            moved = below.call(lambda lower: lower.write_entry(entry, fill), False)
        else:
            moved = self._demote(entry, views, lambda: engine.confirm(ref, entry, views))
        if not moved:
            return  # the put's eviction drops it instead
        if engine.remove_entry(ref, count_as=H.spills):
            return
        # replaced here while it moved: what went down is stale
        if below is not None:
            below.call(lambda lower: lower.delete(entry.key), False)
        elif self._demote_to is not None:
            self._demote_to.delete(entry.key)

    # ------------------------------------------------------------ promoting

    def _read_below(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read that missed here: from below, promoting the entry here first if asked."""
        below = self._below
        assert below is not None
        if self._promote == PROMOTE_ON_HIT:
            moved = below.call(lambda lower: self._promote_from(lower, key), None)
            if moved:
                found = self._read(key, copy, count=False)
                if found is not None:
                    return found  # type: ignore[no-any-return]
            if moved is None:  # not in the lower pool itself (its miss is counted): further down
                return below.call(lambda lower: lower.read_further_below(key, copy), None)
        return below.call(lambda lower: lower.read_chain(key, copy), None)

    def read_further_below(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read for the pool above, whose own lookup here missed: from the pools below
        this one, promoting as this pool is configured to."""
        return None if self._below is None else self._read_below(key, copy)

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

        def fill(targets: list[memoryview]) -> int | None:
            transfer.scatter(targets, tuple(views))
            return entry.checksum if lower.confirm(ref, entry, views) else None

        if not self.write_entry(entry, fill, replace=False):
            return False
        upkeep.add_to_counters(self._engine, {H.promotions: 1})
        lower.remove_entry(ref)
        return True

    def read_chain(self, key: Key, copy: Callable[..., T]) -> T | None:
        """A read for the pool above: here, then below (``copy`` as for ``Store.read``)."""
        found = self._read(key, copy)
        if found is None and self._below is not None:
            return self._read_below(key, copy)
        return found  # type: ignore[no-any-return]

    # ------------------------------------------------- chain-wide operations

    def keys(self) -> KeyList[Key]:  # type: ignore[override]
        """The keys live now in this pool and the pools below it, each once."""
        keys = super().keys()
        if self._below is not None:
            here = set(keys)
            keys.extend(key for key in self._keys_below() if key not in here)
        return keys

    def touch(self, key: Key, ttl: float | str | None = None) -> bool:
        """See ``MappingMixin.touch``; in whichever tier holds ``key``."""
        if super().touch(key, ttl):
            return True
        return self._below is not None and self._below.call(lambda p: p.touch(key, ttl), False)

    def ttl(self, key: Key) -> float | None:
        """See ``MappingMixin.ttl``; from whichever tier holds ``key``."""
        try:
            return super().ttl(key)
        except KeyError:
            if self._below is None:
                raise
        none: list[float | None] = []
        left = self._below.call(lambda p: [p.ttl(key)] if key in p else none, none)
        if not left:
            raise KeyError(key)
        return left[0]

    def clear(self) -> int:  # type: ignore[override]  # a count, as MappingMixin's
        """Remove every entry of every tier; return how many were removed."""
        removed = super().clear()
        return removed + (0 if self._below is None else self._below.call(lambda p: p.clear(), 0))

    @overload
    def pop(self, key: Key) -> Value: ...
    @overload
    def pop(self, key: Key, default: Default) -> Value | Default: ...
    def pop(self, key: Key, default: object = _NO_DEFAULT) -> object:
        """See ``MappingMixin.pop``; the key is removed from every tier."""
        value: object = super().pop(key, None)
        if self._below is not None:
            if value is None:
                value = self._below.call(lambda p: p.pop(key, None), None)
            else:
                self._forget_below(key)
        if value is None:
            if default is _NO_DEFAULT:
                raise KeyError(key)
            return default
        return value

    def popitem(self) -> tuple[Key, Value]:
        """See ``MappingMixin.popitem``; from this pool first, then from below."""
        try:
            return super().popitem()
        except KeyError:
            if self._below is None:
                raise
        none: list[tuple[Key, Value]] = []
        item = self._below.call(lambda p: [p.popitem()] if len(p) else none, none)
        if not item:
            raise KeyError("popitem(): the pool is empty")
        return item[0]

    def _forget_below(self, key: Key) -> bool:
        """Remove ``key`` from every tier below; whether any held it."""
        return self._below is not None and self._below.call(lambda p: p.delete(key), False)

    def _contains_below(self, key: Key) -> bool:
        return self._below is not None and self._below.call(lambda p: key in p, False)

    def _keys_below(self) -> list[Key]:
        return [] if self._below is None else self._below.call(lambda p: list(p.keys()), [])

    def _len_below(self) -> int:
        return 0 if self._below is None else self._below.call(len, 0)
