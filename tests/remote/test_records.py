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


LIMIT = 1 << 30
"""The most bytes a record may declare here (a reading pool's size)."""
KEY = bytes(range(32))


def _round_trip(
    entry: StoredEntry, body: list[bytes], part_bytes: int, mac_key: bytes | None = None
) -> records.Decoded | records.Fault:
    encoded = records.encode(entry, body, part_bytes, mac_key)
    parts = [bytes(part) for part in encoded.parts]
    return records.decode(entry.key, parts, max_bytes=LIMIT, mac_key=mac_key)


@given(
    key=st.binary(min_size=1, max_size=64),
    payload=st.binary(max_size=5000),
    part_bytes=st.sampled_from([1024, 1500, 4096, 1 << 20]),
)
def test_an_entry_comes_back_whole_from_any_number_of_parts(key, payload, part_bytes):
    entry = _entry(key, b"hdr", payload)
    decoded = _round_trip(entry, [key, b"hdr", payload], part_bytes)
    assert isinstance(decoded, records.Decoded)
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
    assert records.parts_of(bytes(encoded.parts[0]), LIMIT) == 3


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
    found = [None if p is None else bytes(p) for p in parts]
    assert records.decode(key, found, max_bytes=LIMIT) is records.Fault.DAMAGED


def test_a_damaged_head_field_is_a_miss():
    entry = _entry(b"key", b"", b"v" * 100)
    head = bytearray(records.encode(entry, [b"key", b"", b"v" * 100], 4096).parts[0])
    head[24:28] = (1 << 30).to_bytes(4, "little")  # parts: far more than there are
    assert records.decode(b"key", [bytes(head)], max_bytes=LIMIT) is records.Fault.DAMAGED


def test_a_head_that_declares_a_million_parts_asks_for_none():
    """A planted head must not make a read pipeline a million GETs (they took 8.7-96 s)."""
    entry = _entry(b"key", b"", b"v" * 100)
    head = bytearray(records.encode(entry, [b"key", b"", b"v" * 100], 4096).parts[0])
    head[24:28] = (1 << 20).to_bytes(4, "little")
    assert records.parts_of(bytes(head), LIMIT) == 0
    head[24:28] = (3).to_bytes(4, "little")
    assert records.parts_of(bytes(head), LIMIT) == 3  # the control: a plausible count passes


def test_a_head_that_declares_more_bytes_than_the_pool_holds_is_not_followed():
    entry = _entry(b"key", b"", b"v" * 10_000)
    head = bytes(records.encode(entry, [b"key", b"", b"v" * 10_000], 4096).parts[0])
    assert records.parts_of(head, 10_003) == 3
    assert records.parts_of(head, 10_002) == 0


def test_a_huge_entry_is_cut_into_at_most_max_parts():
    payload = b"p" * (records.MAX_PARTS * 10)
    entry = _entry(b"k", b"", payload)
    encoded = records.encode(entry, [b"k", b"", payload], 1)
    assert len(encoded.parts) <= records.MAX_PARTS
    assert isinstance(_round_trip(entry, [b"k", b"", payload], 1), records.Decoded)


def test_signed_records_come_back_and_forged_ones_are_rejected():
    payload = bytes(range(256)) * 40
    entry = _entry(b"key", b"", payload)
    assert isinstance(_round_trip(entry, [b"key", b"", payload], 4096, KEY), records.Decoded)
    # a forger without the key: a correct checksum is no longer enough
    unsigned = [bytes(p) for p in records.encode(entry, [b"key", b"", payload], 4096).parts]
    assert records.decode(b"key", unsigned, max_bytes=LIMIT) is not records.Fault.REJECTED
    assert records.decode(b"key", unsigned, max_bytes=LIMIT, mac_key=KEY) is records.Fault.REJECTED
    other = [bytes(p) for p in records.encode(entry, [b"key", b"", payload], 4096, KEY[::-1]).parts]
    assert records.decode(b"key", other, max_bytes=LIMIT, mac_key=KEY) is records.Fault.REJECTED
    # a signed record changed anywhere after signing: head fields, key, payload
    for offset in (8, records.HEAD.size + 1, 2000):
        signed = [
            bytearray(p) for p in records.encode(entry, [b"key", b"", payload], 4096, KEY).parts
        ]
        signed[0][offset] ^= 1
        got = records.decode(b"key", [bytes(p) for p in signed], max_bytes=LIMIT, mac_key=KEY)
        assert got is records.Fault.REJECTED


@pytest.mark.parametrize(
    ("reply", "fault"),
    [
        (7, records.Fault.REJECTED),  # an integer: GET never answers one
        (ValueError("WRONGTYPE Operation against a key"), records.Fault.REJECTED),
        (b"", records.Fault.DAMAGED),  # a string, too short to be one of our heads
        (None, records.Fault.MISSING),
    ],
)
def test_a_reply_no_record_gets_is_a_fault_not_an_exception(reply, fault):
    assert records.decode(b"key", [reply], max_bytes=LIMIT) is fault
