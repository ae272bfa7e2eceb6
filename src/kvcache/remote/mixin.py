"""The pool's half of the remote tier (``Pool`` mixes it in; see ``kvcache.remote``).

Two handles of one chain hold the same ``RemoteLink``: the pool a caller
opened (``_remote``: reads, write-through, deletes; its header counts the
traffic) and the bottom local pool of its chain (``_demote_to``: what it
evicts goes to the remote instead of being dropped; unset with write-through,
where the remote already has every put). A pool opened alone is both.

What the remote is *not* asked about: ``keys``, ``len``, ``clear``, ``touch``
and ``ttl`` act on the local tiers only (a namespace is shared with other
hosts: listing or clearing it is an operator's decision, not a cache call).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import transfer
from ..engine import upkeep
from ..errors import KVCacheError, OutOfSharedMemoryError, PoolFullError
from ..keys import Key, encode_key
from ..layout import REMOTE_COUNTERS, H
from ..reports import RemoteStats
from ..settings import read_settings
from ..stored import StoredEntry
from . import records
from .link import RemoteLink

if TYPE_CHECKING:
    from ..engine import Store

T = TypeVar("T")
_WORDS = {name: getattr(H, f"remote_{name}") for name in REMOTE_COUNTERS}


class RemoteMixin:
    """Reads from, writes to and counts the remote tier."""

    _remote: RemoteLink | None = None
    _demote_to: RemoteLink | None = None
    _engine: Store
    _segment: Any
    _clock: Callable[[], float]
    name: str

    # Pool's and TierMixin's, declared for the type checker
    write_entry: Callable[..., bool]
    _read: Callable[..., Any]
    _spill: Callable[[int], None]
    in_local_tiers: Callable[[Key], bool]

    def attach_demote_to(self, link: RemoteLink) -> None:
        """Make ``link`` the place this pool's evicted entries go (the chain's bottom pool)."""
        self._demote_to = link
        self._engine.spill = self._spill

    @property
    def remote(self) -> RemoteLink | None:
        """This pool's remote tier, or None."""
        return self._remote

    def remote_stats(self) -> RemoteStats | None:
        """The remote tier's place, state and counters; None without one."""
        link = self._remote
        if link is None:
            return None
        link.settle()  # this process's counts so far
        counts = upkeep.read_counters(self._engine, _WORDS)
        spec = link.spec
        return RemoteStats(
            spec.url, spec.namespace, spec.write_through, not link.is_down, link.problem, **counts
        )

    def remote_counts(self) -> dict[str, int] | None:
        """The remote tier's counters (``layout.REMOTE_COUNTERS``) from the header, without
        a call to the remote (a pool opened with ``chain=False`` has them too); None if the
        pool names no remote."""
        if self._remote is not None:
            self._remote.settle()
        elif read_settings(self._segment.path, self.name).remote is None:
            return None
        return upkeep.read_counters(self._engine, _WORDS)

    def count_present(self, keys: Sequence[Key]) -> int:
        """How many of ``keys``, from the first, are in this pool, its chain or its remote.

        The keys missing locally are asked about in one pipelined round trip to
        the remote, not one each (``PrefixCache.lookup``).
        """
        missing = self._missing_locally(keys)
        if self._remote is None or not missing:
            return missing[0] if missing else len(keys)
        found = self._remote.exists([encode_key(keys[i])[0] for i in missing])
        return next((i for i, there in zip(missing, found, strict=True) if not there), len(keys))

    def prefetch(self, keys: Sequence[Key]) -> int:
        """Fetch the entries of ``keys`` missing locally from the remote, in one pipelined
        round trip, and promote them here, stopping at the first one neither has; return
        how many came (``PrefixCache.retrieve`` then reads them all locally)."""
        if self._remote is None:
            return 0
        missing = self._missing_locally(keys)
        fetched = self._remote.fetch([encode_key(keys[i])[0] for i in missing])
        promoted = 0
        for decoded in fetched:
            if decoded is None or not self._promote_remote(decoded):
                break
            promoted += 1
        return promoted

    def _missing_locally(self, keys: Sequence[Key]) -> list[int]:
        """Positions of the keys no local tier holds (the remote's part of a prefix)."""
        return [i for i, key in enumerate(keys) if not self.in_local_tiers(key)]

    # ------------------------------------------------------ for Pool's own calls

    def _read_remote(self, key: Key, copy: Callable[[bytes, transfer.Payload], T]) -> T | None:
        """A read that missed every local tier: from the remote, promoted here."""
        assert self._remote is not None
        decoded = self._remote.fetch([encode_key(key)[0]])[0]
        if decoded is None or decoded.entry.expires_at <= self._clock():
            return None
        if self._promote_remote(decoded):
            found: T | None = self._read(key, copy, count=False)
            if found is not None:
                return found
        # not kept here (larger than the pool, no room now): served from what arrived
        entry = decoded.entry
        body = decoded.views[0] if len(decoded.views) == 1 else memoryview(b"".join(decoded.views))
        start = len(entry.key) + entry.header_len
        header = bytes(body[len(entry.key) : start])
        return copy(header, transfer.Payload([body[start:]]))

    def _promote_remote(self, decoded: records.Decoded) -> bool:
        """Store a verified remote entry here (never over a newer put); whether it was."""
        entry = decoded.entry

        def fill(targets: list[memoryview]) -> int:
            transfer.scatter(targets, tuple(decoded.views))
            return entry.checksum

        try:
            stored = self.write_entry(entry, fill, replace=False)
        except (PoolFullError, OutOfSharedMemoryError):  # ValueTooLargeError is a PoolFullError
            return False
        if stored:
            upkeep.add_to_counters(self._engine, {H.promotions: 1})
        return bool(stored)

    def _remote_after_put(self, entry: StoredEntry, pieces: Sequence[Any]) -> None:
        """Write a put through to the remote, or remove the remote's older value."""
        assert self._remote is not None
        if self._remote.spec.write_through:
            self._remote.store(entry, pieces)
        else:
            self._remote.delete(entry.key)  # an older value there must never come back

    def _demote(
        self, entry: StoredEntry, views: list[memoryview], confirm: Callable[[], bool]
    ) -> bool:
        """Queue an evicted entry for the remote; whether it was (then it may go here)."""
        link = self._demote_to
        assert link is not None
        if entry.expires_at != math.inf and entry.expires_at <= self._clock():
            return False
        encoded = link.encode(entry, views)
        return encoded is not None and confirm() and link.send(entry, encoded)

    def _count_remote(self, deltas: dict[str, int]) -> None:
        """Add to the remote counters in the header (called by the link, any thread)."""
        # closed or damaged meanwhile: a counter is not worth an error
        with contextlib.suppress(KVCacheError):
            upkeep.add_to_counters(
                self._engine, {_WORDS[name]: delta for name, delta in deltas.items()}
            )


class Attachable(Protocol):
    """What ``attach`` needs of a pool: a remote to read and write through, a place for
    its evicted entries."""

    _remote: RemoteLink | None

    def attach_demote_to(self, link: RemoteLink) -> None: ...


def attach(pool: Attachable, link: RemoteLink | None, *, top: bool, bottom: bool) -> None:
    """Give ``pool`` its part of the chain's remote ``link`` (see the module docstring)."""
    if link is None:
        return
    if top:
        pool._remote = link
    if bottom and not link.spec.write_through:
        pool.attach_demote_to(link)
