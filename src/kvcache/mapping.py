"""The ``dict`` side of a ``Pool``: the key list and the item and value views.

``Pool`` is a ``collections.abc.MutableMapping``; what the standard mixins
would do by listing or copying the whole pool, it does itself (``pop``,
``popitem``, ``clear``, ``touch`` and ``ttl`` through its chain). The
standard views do not suit a mapping that other processes change while it is
iterated: they look each key up with ``pool[key]``, which raises ``KeyError``
for a key that another process removed in the meantime, and they compare
values with ``==``, which is ambiguous for numpy arrays. The views here read
each value only when iteration reaches it (nothing is copied up front, and no
lock is held while the caller's loop runs) and skip keys that vanished.
"""

from __future__ import annotations

from collections import abc
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

K = TypeVar("K")
V = TypeVar("V")
Default = TypeVar("Default")
Value = bytes | np.ndarray
NO_DEFAULT: object = object()
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
