"""The remote as a tier of a chain: what spill and promote need of a ``RemoteLink``.

Two chains of one open share the same ``RemoteLink``: the chain of the pool a
caller opened holds it as its ``remote`` (reads, write-through, deletes; that
pool's header counts the traffic, through :func:`add_counts`) and the chain of
the bottom local pool as its ``demote_to`` (what it evicts goes to the remote
instead of being dropped; unset with write-through, where the remote already
has every put). A pool opened alone is both.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import transfer
from ..engine import Store, upkeep
from ..errors import KVCacheError
from ..layout import REMOTE_COUNTERS, H
from ..reports import RemoteStats
from ..stored import StoredEntry
from . import records
from .link import RemoteLink

T = TypeVar("T")
COUNTER_WORDS = {name: getattr(H, f"remote_{name}") for name in REMOTE_COUNTERS}
"""The header word of each remote counter (``layout.REMOTE_COUNTERS``)."""


class RemoteTier:
    """One chain's hold on a ``RemoteLink``: entries out (fetch, copy) and in (demote,
    write-through), each bounded by the link's deadline; a failing remote is a miss."""

    def __init__(self, link: RemoteLink, clock: Callable[[], float]) -> None:
        self.link = link
        self._clock = clock

    def fetch(self, keys: Sequence[bytes]) -> list[records.Decoded | None]:
        """The verified entries of ``keys`` (encoded), None where missing, in one round trip."""
        return self.link.fetch(keys)

    def read(self, key_bytes: bytes) -> records.Decoded | None:
        """The verified, unexpired entry of ``key_bytes``, or None."""
        decoded = self.link.fetch([key_bytes])[0]
        if decoded is None or decoded.entry.expires_at <= self._clock():
            return None
        return decoded

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether the remote holds each of ``keys`` (encoded), in one round trip."""
        return self.link.exists(keys)

    def demote(
        self, entry: StoredEntry, views: list[memoryview], confirm: Callable[[], bool]
    ) -> bool:
        """Queue an evicted entry for the remote if ``confirm`` says its bytes are still the
        entry's; whether it was (then it may be removed from the pool above)."""
        if entry.expires_at != math.inf and entry.expires_at <= self._clock():
            return False
        encoded = self.link.encode(entry, views)
        return encoded is not None and confirm() and self.link.send(entry, encoded)

    def after_put(self, entry: StoredEntry, pieces: Sequence[Any]) -> None:
        """Write a put through to the remote, or remove the remote's older value."""
        if self.link.spec.write_through:
            self.link.store(entry, pieces)
        else:
            self.link.delete(entry.key)  # an older value there must never come back

    def delete(self, key_bytes: bytes) -> None:
        """Remove ``key_bytes`` there (queued: the remote's answer is not waited for)."""
        self.link.delete(key_bytes)

    def stats(self, counts: dict[str, int]) -> RemoteStats:
        """The remote's place and state, with ``counts`` (the header's counters)."""
        spec, link = self.link.spec, self.link
        return RemoteStats(
            spec.url, spec.namespace, spec.write_through, not link.is_down, link.problem, **counts
        )


def copy_out(decoded: records.Decoded, copy: Callable[[bytes, transfer.Payload], T]) -> T:
    """``copy`` of a fetched entry's (codec header, payload), served from what arrived."""
    entry = decoded.entry
    body = decoded.views[0] if len(decoded.views) == 1 else memoryview(b"".join(decoded.views))
    start = len(entry.key) + entry.header_len
    header = bytes(body[len(entry.key) : start])
    return copy(header, transfer.Payload([body[start:]]))


def add_counts(store: Store, deltas: dict[str, int]) -> None:
    """Add to the remote counters in ``store``'s header (the link's sink, any thread)."""
    # closed or damaged meanwhile: a counter is not worth an error
    with contextlib.suppress(KVCacheError):
        words = {COUNTER_WORDS[name]: delta for name, delta in deltas.items()}
        upkeep.add_to_counters(store, words)


def read_counts(store: Store) -> dict[str, int]:
    """The remote counters in ``store``'s header."""
    return upkeep.read_counters(store, COUNTER_WORDS)
