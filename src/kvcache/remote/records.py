"""How an entry is laid out in Redis: a header of kvcache's own, then its bytes, in parts.

One entry is one or more Redis strings, all under one hash tag (so on one
Cluster shard)::

    kvcache:NS:{H}      head (72 bytes) | key | value header | payload ...   part 0
    kvcache:NS:{H}:1    ... payload continued                              part 1
    ...

``H`` is the xxh3-128 of the key's bytes in hex; the head repeats the key, so
a read checks it got the key it asked for. The head carries what a promotion
needs (flags, lengths, priority, expiry) and the entry's checksum
(``transfer.checksum``, the same sum the pools keep), verified over every part
on every read: a value that is damaged, half evicted by Redis's maxmemory, or
mixed from two writers' parts is a miss, never returned.

The checksum guards against accidents, not against people: anyone who may
write the namespace can write a record with a correct checksum. A pool given
a key (``--remote-key-file``) signs each record with keyed BLAKE2b over its
head and every byte after it (the ``mac`` field, zero while it is computed);
a reader with the key serves only records whose MAC matches (one that fails
is *rejected*: a counted miss, left in place, since it is not ours to delete).
The head's lengths and part count are bounded before anything else is asked
for: at most ``MAX_PARTS`` parts, and no more bytes than the reading pool could
store, so a planted head cannot make a read ask for a million parts.

    head: magic "KVR2" | flags u32 | key_len u32 | header_len u32 | value_len u64
          | parts u32 | (zero) u32 | priority i64 | expires_at f64 | checksum u64
          | mac 16 bytes

Parts exist because Redis refuses strings over its bulk limit
(``proto-max-bulk-len``, 512 MB by default); parts of ``part_bytes`` keep
each command short. An entry is encoded into one ``bytes`` (one copy of the
value, made when it is queued) and the parts are views of it.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from .. import transfer
from ..layout import KNOWN_FLAGS, PRIORITY_LIMIT
from ..stored import StoredEntry

MAGIC = b"KVR2"
HEAD = struct.Struct("<4sIIIQIIqdQ16s")
"""magic, flags, key_len, header_len, value_len, parts, (zero), priority, expires_at,
checksum, mac: 72 bytes."""
MAC_BYTES = 16
MAC_OFFSET = HEAD.size - MAC_BYTES
NO_MAC = bytes(MAC_BYTES)
MAX_PARTS = 1024
"""An entry is cut into at most this many parts (bigger parts past that): 64 GiB
at the default part size, and a bound on the GETs one planted head can cause."""
MAX_KEY_BYTES = 1024
"""A pool key's limit; parts are never smaller, so part 0 always holds the whole key."""
MAX_HEADER_BYTES = 1 << 16
DEFAULT_PART_BYTES = 64 << 20
"""Far below Redis's 512 MB bulk limit: one part is one short command, not a stall."""


def key_name(namespace: str, key: bytes) -> str:
    """The Redis key of part 0 of ``key``'s entry."""
    return f"kvcache:{namespace}:{{{xxhash.xxh3_128_hexdigest(key)}}}"


def part_names(head_name: str, parts: int) -> list[str]:
    """The Redis keys of parts 1.. of an entry whose part 0 is ``head_name``."""
    return [f"{head_name}:{i}" for i in range(1, parts)]


@dataclass(frozen=True)
class Encoded:
    """An entry ready to send: its parts, views of one buffer."""

    parts: list[memoryview]

    @property
    def num_bytes(self) -> int:
        return sum(len(part) for part in self.parts)


class Fault(enum.Enum):
    """Why a read found no entry to serve."""

    MISSING = "missing"  # no head: never written, expired or evicted
    DAMAGED = "damaged"  # ours but broken: torn, half evicted, mixed, a bad sum (deleted)
    REJECTED = "rejected"  # not a record we may serve: a MAC that fails, a foreign reply


def encode(
    entry: StoredEntry, views: Sequence[Any], part_bytes: int, mac_key: bytes | None = None
) -> Encoded:
    """Copy an entry's bytes (key | value header | payload, from ``views``) into parts,
    signed with ``mac_key`` if given.

    One ``join`` makes the copy: no zero-filled buffer written twice (measured: a
    pipelined 16 MiB put went from 0.58 to 0.78 of plain redis-py's SET). The MAC
    reads the bytes once more before it.
    """
    parts = max(1, math.ceil(entry.num_bytes / part_bytes))
    if parts > MAX_PARTS:
        part_bytes = math.ceil(entry.num_bytes / MAX_PARTS)
        parts = math.ceil(entry.num_bytes / part_bytes)
    fields = (
        MAGIC,
        entry.flags,
        len(entry.key),
        entry.header_len,
        entry.value_len,
        parts,
        0,
        entry.priority,
        entry.expires_at,
        entry.checksum,
    )
    mac = NO_MAC if mac_key is None else _mac(mac_key, HEAD.pack(*fields, NO_MAC), views)
    head = HEAD.pack(*fields, mac)
    whole = memoryview(b"".join((head, *views)))
    if parts == 1:
        return Encoded([whole])
    cuts = [HEAD.size + i * part_bytes for i in range(parts)] + [len(whole)]
    return Encoded([whole[: cuts[1]], *(whole[cuts[i] : cuts[i + 1]] for i in range(1, parts))])


@dataclass(frozen=True)
class Decoded:
    """A verified entry read back: its metadata and views of its bytes."""

    entry: StoredEntry
    views: list[memoryview]  # key | value header | payload, over the parts as received


def parts_of(head: object, max_bytes: int) -> int:
    """How many parts the entry whose part 0 is ``head`` has: 0 if it is not one of ours,
    or declares more parts or bytes than a reader of at most ``max_bytes`` takes."""
    fields = _head_fields(head, max_bytes)
    return 0 if fields is None else fields[5]


def _head_fields(head: object, max_bytes: int) -> tuple[Any, ...] | None:
    """The unpacked head of part 0; None if it is not one of ours, or out of bounds."""
    if not isinstance(head, bytes) or len(head) < HEAD.size or head[:4] != MAGIC:
        return None
    fields = HEAD.unpack_from(head)
    declared = fields[2] + fields[3] + fields[4]
    return fields if 1 <= fields[5] <= MAX_PARTS and declared <= max_bytes else None


def decode(
    key: bytes, parts: Sequence[object], *, max_bytes: int, mac_key: bytes | None = None
) -> Decoded | Fault:
    """The entry in ``parts`` (part 0 first, as Redis answered) if it is whole, intact,
    ``key``'s, at most ``max_bytes`` and, with ``mac_key``, signed with it."""
    if not parts or parts[0] is None:
        return Fault.MISSING
    if not all(part is None or isinstance(part, bytes) for part in parts):
        return Fault.REJECTED  # an integer, an error (WRONGTYPE): not what GET gives a record
    if any(part is None for part in parts):
        return Fault.DAMAGED  # evicted in part
    head = parts[0]
    assert isinstance(head, bytes)
    fields = _head_fields(head, max_bytes)
    if fields is None or fields[5] != len(parts):
        return Fault.DAMAGED
    _, flags, key_len, header_len, value_len, _, _, priority, expires_at, checksum, mac = fields
    views = [memoryview(head)[HEAD.size :], *(memoryview(p) for p in parts[1:])]  # type: ignore[arg-type]
    if mac_key is not None:
        unsigned = head[:MAC_OFFSET] + NO_MAC
        if not hmac.compare_digest(_mac(mac_key, unsigned, views), mac):
            return Fault.REJECTED
    received = len(head) - HEAD.size if len(views) == 1 else sum(len(v) for v in views)
    if (
        key_len != len(key)
        or flags & ~KNOWN_FLAGS
        or header_len > MAX_HEADER_BYTES
        or abs(priority) >= PRIORITY_LIMIT
        or received != key_len + header_len + value_len
        or views[0][:key_len] != key
        or math.isnan(expires_at)
    ):
        return Fault.DAMAGED
    # A signed record's bytes are the signer's, sum included: no need to sum them again.
    if (
        mac_key is None
        and transfer.checksum(views, flags, key_len, header_len, value_len) != checksum
    ):
        return Fault.DAMAGED
    entry = StoredEntry(key, flags, header_len, value_len, priority, expires_at, checksum)
    return Decoded(entry, views)


def _mac(mac_key: bytes, head: bytes, views: Sequence[Any]) -> bytes:
    """Keyed BLAKE2b of a head (its mac zero) and the bytes after it: the stdlib's, at
    about the speed of a copy, with no second dependency (HMAC-SHA256 is ~2x slower)."""
    digest = hashlib.blake2b(head, key=mac_key, digest_size=MAC_BYTES)
    for view in views:
        digest.update(view)
    return digest.digest()
