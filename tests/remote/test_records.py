"""How entries lie in Redis: encoded into parts and verified on the way back (no server)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcache import transfer
from kvcache.layout import KEY_IS_STR
from kvcache.remote import records
from kvcache.stored import StoredEntry


def _entry(key: bytes, header: bytes, payload: bytes, **fields: object) -> StoredEntry:
    flags = int(fields.pop("flags", KEY_IS_STR))
    checksum = transfer.checksum([key, header, payload], flags, len(key), len(header), len(payload))
    return StoredEntry(key, flags, len(header), len(payload), 3, math.inf, checksum, **fields)  # type: ignore[arg-type]


def _round_trip(entry: StoredEntry, body: list[bytes], part_bytes: int) -> records.Decoded | None:
    encoded = records.encode(entry, body, part_bytes)
    return records.decode(entry.key, [bytes(part) for part in encoded.parts])


@given(
    key=st.binary(min_size=1, max_size=64),
    payload=st.binary(max_size=5000),
    part_bytes=st.sampled_from([1024, 1500, 4096, 1 << 20]),
)
def test_an_entry_comes_back_whole_from_any_number_of_parts(key, payload, part_bytes):
    entry = _entry(key, b"hdr", payload)
    decoded = _round_trip(entry, [key, b"hdr", payload], part_bytes)
    assert decoded is not None
    assert decoded.entry == entry
    assert b"".join(decoded.views) == key + b"hdr" + payload


def test_parts_share_one_hash_tag_and_the_head_names_their_count():
    entry = _entry(b"k", b"", b"x" * 10_000)
    encoded = records.encode(entry, [b"k", b"", b"x" * 10_000], 4096)
    assert len(encoded.parts) == 3
    head = records.key_name("ns", b"k")
    names = [head, *records.part_names(head, 3)]
    tags = {name[name.index("{") : name.index("}") + 1] for name in names}
    assert len(tags) == 1 and head.startswith("kvcache:ns:{")
    assert records.parts_of(bytes(encoded.parts[0])) == 3


@pytest.mark.parametrize(
    "damage",
    ["flip payload", "missing part", "extra part", "other key", "short head", "not ours", "swap"],
)
def test_anything_but_the_whole_intact_entry_is_a_miss(damage):
    payload = bytes(range(256)) * 40
    entry = _entry(b"key", b"", payload)
    parts = [bytearray(p) for p in records.encode(entry, [b"key", b"", payload], 4096).parts]
    key = b"key"
    if damage == "flip payload":
        parts[1][100] ^= 1
    elif damage == "missing part":
        parts[2] = None  # type: ignore[call-overload]  # evicted by Redis
    elif damage == "extra part":
        parts.append(bytearray(b"more"))
    elif damage == "other key":
        key = b"kez"
    elif damage == "short head":
        parts[0] = parts[0][:20]
    elif damage == "not ours":
        parts[0][:4] = b"XXXX"
    else:  # parts of two versions mixed
        parts[1], parts[2] = parts[2], parts[1]
    assert records.decode(key, [None if p is None else bytes(p) for p in parts]) is None


def test_a_damaged_head_field_is_a_miss():
    entry = _entry(b"key", b"", b"v" * 100)
    head = bytearray(records.encode(entry, [b"key", b"", b"v" * 100], 4096).parts[0])
    head[24:28] = (1 << 30).to_bytes(4, "little")  # parts: far more than there are
    assert records.decode(b"key", [bytes(head)]) is None
