"""The ``dict`` side of a ``Pool``: pop, clear, touch, ttl and the key/item/value views.

``MappingMixin`` holds what ``Pool`` adds to ``put``/``get``/``delete`` to be
a ``collections.abc.MutableMapping`` (and what diskcache and cachetools users
expect: ``touch``, ``ttl``, ``clear`` returning a count), each a call of the
store's upkeep (``kvcache.engine.upkeep``), kept apart so that the pool module
reads as the put/get paths.

The standard views do not suit a mapping that other processes change while
it is iterated: the
mixins look each key up with ``pool[key]``, which raises ``KeyError`` for a
key that another process removed in the meantime, and they compare values
with ``==``, which is ambiguous for numpy arrays. The views here read each
value only when iteration reaches it (nothing is copied up front, and no lock
is held while the caller's loop runs) and skip keys that vanished.
"""

from __future__ import annotations

import contextlib
import math
from collections import abc
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

import numpy as np

from .config import PoolConfig
from .engine import Store, upkeep
from .errors import reports_damage
from .keys import Key
from .units import parse_duration

K = TypeVar("K")
V = TypeVar("V")
Default = TypeVar("Default")
Value = bytes | np.ndarray
_NO_DEFAULT: object = object()
"""``pop``'s default when none is given: a miss raises KeyError, as dict's does."""


def _set_or_list(name: str) -> Callable[[list[Any], object], bool]:
    as_set, as_list = getattr(abc.Set, name), getattr(list, name)

    def compare(self: list[Any], other: object) -> bool:
        return as_set(self, other) if isinstance(other, abc.Set) else as_list(self, other)  # type: ignore[no-any-return]

    compare.__name__ = name
    return compare


class KeyList(list[K], abc.Set[K]):
    """The keys of a pool at one moment: a list that also has ``dict.keys()``'s set algebra.

    ``Pool.keys()`` returned a plain list before ``Pool`` became a mapping, and
    callers index, sort and compare it with lists; a ``KeysView`` would be a
    set. This is both: against a list it compares as a list, against a set
    (``==``, ``<=``, ...) as a set, and ``&``, ``|``, ``-``, ``^`` and
    ``isdisjoint`` work as on ``dict.keys()``. It is a copy: later changes to
    the pool do not show in it.
    """

    __slots__ = ()
    __eq__ = _set_or_list("__eq__")
    __ne__ = _set_or_list("__ne__")
    __lt__ = _set_or_list("__lt__")
    __le__ = _set_or_list("__le__")
    __gt__ = _set_or_list("__gt__")
    __ge__ = _set_or_list("__ge__")

    @classmethod
    def _from_iterable(cls, items: Iterable[Any]) -> set[Any]:
        return set(items)  # the result of &, | ...: a set, as for dict.keys()


def same_value(a: object, b: object) -> bool:
    """Whether two values are equal: arrays by dtype, shape and contents, others by ``==``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and (a.dtype, a.shape) == (b.dtype, b.shape)
            and bool(np.array_equal(a, b))
        )
    return a == b


def _live_items(mapping: Mapping[K, V]) -> Iterator[tuple[K, V]]:
    """(key, value) of every key listed now, each value read when reached; vanished keys skipped."""
    for key in mapping:
        value = mapping.get(key)
        if value is not None:
            yield key, value


class ItemsView(abc.ItemsView[K, V]):
    """``Pool.items()``: pairs read one at a time, skipping keys removed meanwhile."""

    __slots__ = ()
    _mapping: Mapping[Any, V]  # set by MappingView (typeshed leaves it undeclared)

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return _live_items(self._mapping)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False  # as in dict.items()
        key, value = item
        return key in self._mapping and same_value(self._mapping.get(key), value)


class ValuesView(abc.ValuesView[V]):
    """``Pool.values()``: values read one at a time, skipping keys removed meanwhile."""

    __slots__ = ()
    _mapping: Mapping[Any, V]

    def __iter__(self) -> Iterator[V]:
        return (value for _, value in _live_items(self._mapping))

    def __contains__(self, value: object) -> bool:
        return any(same_value(mine, value) for mine in self)


class MappingMixin(abc.MutableMapping[Key, Value]):
    """``Pool``'s mapping methods beyond put/get/delete, over its store (``kvcache.engine``)."""

    config: PoolConfig
    _engine: Store

    @overload
    def pop(self, key: Key) -> Value: ...
    @overload
    def pop(self, key: Key, default: Default) -> Value | Default: ...
    @reports_damage
    def pop(self, key: Key, default: object = _NO_DEFAULT) -> object:
        """Remove ``key`` and return its value; ``default`` on a miss, KeyError without one.

        The value returned is the one removed: the entry's generation is noted
        before the copy and the entry is removed only if it is unchanged after
        it, so a value another process puts meanwhile is neither returned
        unremoved nor removed unreturned. Counted in stats as a read (a hit or
        a miss); an entry overtaken ``READ_ATTEMPTS`` times is a miss.
        """
        value = upkeep.take(self._engine, key)
        if value is not None:
            return value
        if default is _NO_DEFAULT:
            raise KeyError(key)
        return default

    @reports_damage
    def popitem(self) -> tuple[Key, Value]:
        """Remove and return some (key, value) pair; KeyError when the pool is empty.

        Which pair is unspecified. Overrides the mixin, which lists every key
        first and takes a key another process removed meanwhile for an empty pool.
        """
        while True:
            key = upkeep.any_key(self._engine)
            if key is None:
                raise KeyError("popitem(): the pool is empty")
            with contextlib.suppress(KeyError):  # gone meanwhile, or expired: take another
                return key, self.pop(key)

    @reports_damage
    def clear(self) -> int:  # type: ignore[override]  # also returns the count, as diskcache's
        """Remove every entry; return how many were removed.

        Removes the entries there when it starts (a value put meanwhile may
        survive), ``engine.eviction.EVICT_BATCH`` per lock hold, like ``evict``, so that other
        processes are never stalled for the whole pool. Like ``delete``, and
        unlike eviction and expiry, it is not counted in ``stats``.
        """
        return upkeep.clear(self._engine)

    @reports_damage
    def touch(self, key: Key, ttl: float | str | None = None) -> bool:
        """Give ``key`` a new expiry, keeping its value; return whether it was there.

        Args:
            ttl: as for ``put``: seconds (or ``"10m"``) from now; None for the
                pool's ``default_ttl_s``, which on a pool without one means
                never (as diskcache's ``touch(key, expire=None)``).

        Raises:
            InvalidArgument: bad key or ttl.
        """
        ttl_s = self.config.default_ttl_s if ttl is None else parse_duration(ttl, what="ttl")
        return upkeep.touch(self._engine, key, ttl_s)

    @reports_damage
    def keys(self) -> KeyList[Key]:  # type: ignore[override]  # a list and a set, see KeyList
        """The keys of all live (unexpired) entries now, in no particular order."""
        return KeyList(upkeep.keys(self._engine))

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

    @reports_damage
    def ttl(self, key: Key) -> float | None:
        """Seconds until ``key`` expires, or None if it never does (no effect on stats).

        Raises:
            KeyError: no live entry for ``key`` (like ``pool[key]``); a None
                here would read as "never expires".
        """
        expires_at = upkeep.expiry(self._engine, key)
        now = self._engine.clock()
        if expires_at <= now:
            raise KeyError(key)
        return None if expires_at == math.inf else expires_at - now
