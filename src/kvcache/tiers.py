"""Tiers: what a pool below another is to the pool above it, and the handle that holds it.

A pool may name a lower pool (``create(..., spill_to=NAME)``, kept in its
header, so every process that opens it follows the same chain to any depth).
To the pool above it (its ``kvcache.chain.Chain``) a lower pool is a ``Tier``:
whole entries out and in (spill, promote), reads through the tiers further
down, and the chain-wide mapping calls. ``Below`` holds the open lower pool
and reopens it by name when it goes away: a lower pool that is missing,
destroyed or broken is a miss (the chain is cut and tried again every
``REOPEN_INTERVAL_S``), never an error for the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from .errors import (
    KVCacheError,
    OutOfSharedMemoryError,
    PoolFullError,
    PoolNotFoundError,
    ValueTooLargeError,
)
from .keys import Key
from .stored import EntryRef, StoredEntry

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
    def popitem(self) -> tuple[Key, Any]: ...
    def keys(self) -> list[Key]: ...
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
