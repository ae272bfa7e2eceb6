"""StateCache: whole engine states by the tokens they were computed for, found by prefix.

``PrefixCache`` keeps KV per chunk of tokens, which works when an engine can
hand over the KV of any token range. Some engines save only their whole state
(llama.cpp: one blob with the KV of every position and its output buffers),
and a state is useful to any later prompt that shares a leading run of tokens
with it. This store keeps such states beside the chunks, on the same keys,
namespaces and checks (``keys``, ``tensors.checksum``), in two kinds of entry::

    record  "kvstate:<ns12>:t<n>:<tail>"   the state of exactly n tokens
    marker  "kvstate:<ns12>:<i>:<link_i>"  for each full chunk i of those tokens:
                                           which record begins with them (the newest)

Finding the state that shares the longest prefix with a query walks the
query's own chunk keys from the longest to the shortest and takes the first
marker whose record checks out: at most ``len(query) / chunk_tokens`` pool
probes, never a scan of what is stored (llama-cpp-python's own caches compare
the query with every stored key). A record found this way shares at least
all of the marker's chunks with the query, maybe more; a state shorter than
one chunk is found only by its exact tokens.

A record, as a pool value::

    offset  size  field
    0       4     magic b"KVST"
    4       2     format version (1)
    6       2     reserved (0)
    8       8     n, tokens
    16      8     payload bytes
    24      16    namespace digest, first 16 bytes
    40      16    BLAKE2b-128 of the record's key
    56      8     xxh3_64 of tokens + payload + bytes 0..55
    64      8n    the tokens, little-endian int64
    64+8n   ...   payload (the engine's bytes, opaque here)

A marker: magic b"KVSM", version, reserved, chunk index (8), the record's n
(8) and tail digest (32), then xxh3_64 of those 56 bytes. Every field a
reader can predict is compared, every length is checked against the bytes
read, and the record's tokens are compared with the query's: a damaged,
foreign or stale entry is a miss, never another prompt's state.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from ..codec import byte_view
from ..counters import RETRIEVE
from ..errors import InvalidArgument
from ..pool import Pool
from .keys import Namespace, as_tokens, chunk_links, link_keys, state_key, state_tail
from .statelayout import StateLayout
from .tensors import checksum

HEAD = struct.Struct("<4sHxxQQ16s16s")
HEAD_BYTES = HEAD.size + 8  # and the checksum
MARKER = struct.Struct("<4sHxxQQ32s")
MARKER_BYTES = MARKER.size + 8
RECORD_MAGIC, MARKER_MAGIC, VERSION = b"KVST", b"KVSM", 1
assert HEAD_BYTES == 64 and MARKER_BYTES == 64


@dataclass(frozen=True)
class StateHit:
    """A stored state found for a query.

    Attributes:
        tokens: the tokens the state was computed for (int64).
        payload: its engine bytes, as stored.
        num_shared: how many leading tokens it shares with the query.
    """

    tokens: np.ndarray
    payload: memoryview
    num_shared: int


class StateCache:
    """Whole engine states of one model in a pool, found by the longest shared token prefix.

    Args:
        pool: the pool to keep states in.
        model: the model's id; states are never shared between ids.
        layout: the engine and the settings its states depend on.
        chunk_tokens: tokens between markers. Smaller finds states sharing
            shorter prefixes, at one small entry per chunk per state.
        salt: a tenant id or other separator.
    """

    def __init__(
        self,
        pool: Pool,
        model: str,
        layout: StateLayout,
        *,
        chunk_tokens: int = 256,
        salt: str | bytes | None = None,
    ) -> None:
        if not isinstance(pool, Pool):
            raise InvalidArgument(f"pool must be a kvcache.Pool, not {type(pool).__name__}")
        if not isinstance(layout, StateLayout):
            raise InvalidArgument(f"layout must be a StateLayout, not {type(layout).__name__}")
        self.pool = pool
        self.namespace = Namespace(model, layout, chunk_tokens, salt)
        self.chunk_tokens = chunk_tokens

    def put(
        self,
        token_ids: object,
        payload: Sequence[object],
        *,
        priority: int = 0,
        ttl: float | str | None = None,
    ) -> str:
        """Store a state of exactly ``token_ids``, and point its chunks' markers at it.

        Args:
            token_ids: the tokens the state was computed for.
            payload: its bytes, as bytes-like pieces (joined here, copied once).
            priority, ttl: passed to :meth:`Pool.put` for the record and its markers.

        Returns:
            The record's key.

        Raises:
            ValueTooLargeError: the state is larger than the pool.
        """
        tokens = as_tokens(token_ids)
        links = chunk_links(self.namespace, tokens)
        tail = state_tail(self.namespace, tokens, links)
        key = state_key(self.namespace, len(tokens), tail)
        pieces = [memoryview(piece).cast("B") for piece in payload]  # type: ignore[arg-type]
        payload_bytes = sum(piece.nbytes for piece in pieces)
        buffer = np.empty(HEAD_BYTES + tokens.nbytes + payload_bytes, np.uint8)
        body = buffer[HEAD_BYTES:]
        body[: tokens.nbytes] = tokens.view(np.uint8)
        offset = tokens.nbytes
        for piece in pieces:
            body[offset : offset + piece.nbytes] = np.frombuffer(piece, np.uint8)
            offset += piece.nbytes
        head = self._head(key, len(tokens), payload_bytes)
        buffer[:HEAD_BYTES] = np.frombuffer(head + _u64(checksum(body, head)), np.uint8)
        self.pool.put(key, byte_view(buffer), priority=priority, ttl=ttl)  # type: ignore[arg-type]
        self.pool.count_tokens(self.namespace.model, stored=len(tokens))
        parent = None
        for index, marker_key in enumerate(link_keys(self.namespace, links)):
            marker = MARKER.pack(MARKER_MAGIC, VERSION, index, len(tokens), tail)
            value = marker + _u64(xxhash.xxh3_64_intdigest(marker))
            self.pool.put(marker_key, value, priority=priority, ttl=ttl, parent=parent)
            parent = marker_key  # for the ``prefix`` policy: a marker goes with the ones before
        return key

    def get(self, token_ids: object, *, count: bool = True) -> StateHit | None:
        """The stored state sharing the longest leading run of tokens with ``token_ids``.

        First the state of exactly these tokens, then, from the longest, each
        full chunk's marker; the first record that checks out is the answer.
        Returns None on a miss (nothing stored, evicted, or damaged).

        ``count``: add ``len(token_ids)`` to the model's tokens queried and the
        tokens shared with the state found to its tokens hit, and time the call
        as a ``retrieve`` (as ``PrefixCache.retrieve`` does); presence checks
        pass False, so that a request is counted once.
        """
        started = self.pool.latency.start(RETRIEVE) if count else 0
        tokens = as_tokens(token_ids)
        hit = self._longest(tokens)
        if count and len(tokens):
            shared = 0 if hit is None else hit.num_shared
            self.pool.count_tokens(self.namespace.model, queried=len(tokens), hit=shared)
        if started:
            self.pool.latency.stop(RETRIEVE, started)
        return hit

    def _longest(self, tokens: np.ndarray) -> StateHit | None:
        """``get``'s search, counting nothing."""
        links = chunk_links(self.namespace, tokens)
        exact_key = state_key(
            self.namespace, len(tokens), state_tail(self.namespace, tokens, links)
        )
        exact = self._read_record(exact_key, len(tokens), tokens)
        if exact is not None and exact.num_shared == len(tokens):
            return exact
        marker_keys = link_keys(self.namespace, links)
        tried = {exact_key}  # markers of one state all name it: read a bad one once
        for index in range(len(links) - 1, -1, -1):
            target = self._read_marker(marker_keys[index], index)
            if target is None or target[0] in tried:
                continue
            tried.add(target[0])
            hit = self._read_record(*target, tokens)
            if hit is not None and hit.num_shared >= (index + 1) * self.chunk_tokens:
                return hit
        return None

    def __repr__(self) -> str:
        ns = self.namespace
        return (
            f"<kvcache.StateCache {ns.model!r} on pool {self.pool.name!r}, "
            f"markers every {self.chunk_tokens} tokens, {ns.layout.engine}>"  # type: ignore[union-attr]
        )

    def _head(self, key: str, num_tokens: int, payload_bytes: int) -> bytes:
        key_digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        digest = self.namespace.digest[:16]
        return HEAD.pack(RECORD_MAGIC, VERSION, num_tokens, payload_bytes, digest, key_digest)

    def _read_marker(self, key: str, index: int) -> tuple[str, int] | None:
        """The record key and token count a marker names, or None if it is missing or bad."""
        value = self.pool.get(key)
        if not isinstance(value, bytes) or len(value) != MARKER_BYTES:
            return None
        magic, version, recorded_index, num_tokens, tail = MARKER.unpack_from(value)
        intact = value[MARKER.size :] == _u64(xxhash.xxh3_64_intdigest(value[: MARKER.size]))
        if (
            not intact
            or (magic, version, recorded_index) != (MARKER_MAGIC, VERSION, index)
            or num_tokens < (index + 1) * self.chunk_tokens
        ):
            return None
        return state_key(self.namespace, num_tokens, tail), num_tokens

    def _read_record(self, key: str, num_tokens: int, query: np.ndarray) -> StateHit | None:
        """The record under ``key`` if it checks out, with how much of ``query`` it shares."""
        value = self.pool.get(key)
        if not isinstance(value, bytes) or len(value) < HEAD_BYTES:
            return None
        payload_bytes = HEAD.unpack_from(value)[3]
        if len(value) != HEAD_BYTES + 8 * num_tokens + payload_bytes:
            return None
        head = self._head(key, num_tokens, payload_bytes)
        body = np.frombuffer(value, np.uint8, offset=HEAD_BYTES)
        if value[: HEAD.size] != head or value[HEAD.size : HEAD_BYTES] != _u64(
            checksum(body, head)
        ):
            return None
        tokens = body[: 8 * num_tokens].view("<i8")
        return StateHit(
            tokens, memoryview(value)[HEAD_BYTES + 8 * num_tokens :], shared_prefix(tokens, query)
        )


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two token arrays have in common."""
    size = min(len(a), len(b))
    differ = np.flatnonzero(a[:size] != b[:size])
    return int(differ[0]) if differ.size else size
