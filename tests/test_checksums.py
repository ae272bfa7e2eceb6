"""Entry checksums: bytes that no longer match what was written are found, never served.

The damage is made for real, by writing into the pool's shared pages the way
a stray writer (or the namespace bug that motivated this) would.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
import xxhash

import kvcache
from kvcache import transfer
from kvcache.keys import key_hash as _hash
from kvcache.layout import ENTRY_WORDS, KEY_IS_STR, E

Maker = Callable[..., kvcache.Pool]


def _damage(pool: kvcache.Pool, key: str, at: int = -1) -> None:
    """Flip one byte of ``key``'s payload in the shared pages (by default its last)."""
    eid = pool._engine.table.index.find(*_hash(key.encode()))
    assert eid >= 0
    _, payload, _ = pool._engine.table.value_views(eid)
    view = payload.views[0] if at >= 0 else payload.views[-1]
    view[at] ^= 0xFF


@pytest.mark.parametrize("size", [100, 200_000])  # copied under the lock, and outside it
def test_check_finds_damaged_bytes_and_repair_removes_them(make_pool: Maker, size: int) -> None:
    pool = make_pool("4M", page_size="4K")
    pool.put("good", b"g" * size)
    pool.put("bad", np.arange(size // 8, dtype=np.float64))
    assert pool.check() == []
    _damage(pool, "bad")
    problems = pool.check()
    assert len(problems) == 1 and "'bad'" in problems[0] and "checksum" in problems[0]
    assert pool.check() == problems  # a check alone changes nothing
    assert pool.check(repair=True) == problems
    assert pool.check() == []
    assert "bad" not in pool and pool.get("good") == b"g" * size
    assert pool.stats().damaged == 1


@pytest.mark.parametrize("size", [100, 200_000, 3_000_000])  # the largest summed as it streams
def test_verify_reads_turns_damage_into_a_miss(make_pool: Maker, size: int) -> None:
    pool = make_pool("4M", page_size="4K", verify_reads=False)
    pool.put("k", b"v" * size)
    _damage(pool, "k")
    unchecked = pool.get("k")  # reads not summed: the damage shows
    assert unchecked is not None and unchecked != b"v" * size
    with kvcache.open(pool.name, verify_reads=True) as checked:
        assert checked.get("k") is None
        assert checked.get_into("k", bytearray(size)) is None
        stats = checked.stats()
    assert stats.damaged == 1 and "k" not in pool
    pool.put("k", b"v" * size)
    with kvcache.open(pool.name, verify_reads=True) as checked:
        assert checked.get("k") == b"v" * size  # sound entries read as usual


READER = """
import sys, kvcache
from kvcache import native
name, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
expected = bytes(range(256)) * (size // 256) + b"t" * (size % 256)
options = {"on": {"verify_reads": True}, "off": {"verify_reads": False}, "default": {}}[mode]
with kvcache.open(name, **options) as pool:
    got = pool.get("k")
    into = bytearray(size)
    length = pool.get_into("k", into)
    seen = ["miss" if v is None else "intact" if v == expected else "damaged" for v in
            (got, None if length is None else bytes(into))]
    print(native.engine(), *seen, pool.stats().damaged)
"""


def _read_in_a_process(name: str, mode: str, size: int, pure: str) -> list[str]:
    """What a new process reading ``k`` sees: its engine, the get's and the get_into's
    answer (miss, intact or damaged bytes) and the pool's damaged count."""
    return subprocess.run(
        [sys.executable, "-c", READER, name, mode, str(size)],
        env={**os.environ, "KVCACHE_PURE_PYTHON": pure},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.mark.parametrize("pure", ["", "1"], ids=["compiled", "pure-python"])
# in one page, in several, outside the lock, a few MiB, and streamed round the cache
@pytest.mark.parametrize("size", [100, 4096, 200_000, 3_000_000, (16 << 20) + 3])
def test_a_byte_flipped_in_dev_shm_is_served_unverified_and_a_damaged_miss_verified(
    make_pool: Maker, size: int, pure: str
) -> None:
    """The damage is written through the segment's file in /dev/shm, as any process that
    maps the pool could; readers of both engines are separate processes. By default
    every value is verified (a damaged miss), whatever its size."""
    pool = make_pool("40M" if size > 8 << 20 else "4M", page_size="4K")
    pool.put("k", bytes(range(256)) * (size // 256) + b"t" * (size % 256))
    engine = "pure-python" if pure else "compiled"
    for mode in ("on", "off"):
        assert _read_in_a_process(pool.name, mode, size, pure) == [engine, "intact", "intact", "0"]
    table = pool._engine.table
    eid = table.find(b"k")
    first_page = table.eq[eid * ENTRY_WORDS + E.first_page]
    at = table.data_offset + first_page * table.page_size + len(b"k") + 50
    with open(pool._segment.path, "r+b") as segment_file:
        (byte,) = os.pread(segment_file.fileno(), 1, at)
        os.pwrite(segment_file.fileno(), bytes([byte ^ 0x01]), at)
    assert _read_in_a_process(pool.name, "off", size, pure) == [engine, "damaged", "damaged", "0"]
    assert _read_in_a_process(pool.name, "default", size, pure) == [engine, "miss", "miss", "1"]
    assert _read_in_a_process(pool.name, "on", size, pure) == [engine, "miss", "miss", "1"]
    assert "k" not in pool and pool.check() == []  # dropped, and nothing else harmed


def test_persist_keeps_the_pool_sums_so_restore_skips_damage(make_pool: Maker, tmp_path) -> None:
    """Regression: persist summed the bytes as it found them, so a damaged entry
    was written with a matching checksum and restored as if it were sound."""
    pool = make_pool("4M", page_size="4K")
    pool.put("good", b"g" * 5000)
    pool.put("bad", b"b" * 5000)
    _damage(pool, "bad", at=10)
    path = kvcache.persist(pool, tmp_path / "snap.kvsnap")
    restored, report = kvcache.restore_with_report(pool.name + "-r", path)
    try:
        assert restored.get("good") == b"g" * 5000
        assert restored.get("bad") is None
        assert len(report.skipped) == 1 and "checksum" in report.skipped[0]
        assert restored.check() == []
    finally:
        restored.close()
        kvcache.destroy(pool.name + "-r")


def test_a_value_changed_by_its_caller_during_a_put_is_caught(
    make_pool: Maker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two passes (the pure-Python path): the sum is taken from the caller's bytes before
    the copy, so a buffer the caller changes meanwhile (a racing thread) leaves an entry
    that check() reports. In one pass (compiled) the bytes are summed as they are copied:
    the entry holds and sums the bytes it copied, a change the copy saw or missed alike."""
    monkeypatch.setattr(kvcache.native, "sum_and_stream", None)
    pool = make_pool("4M", page_size="4K")
    buffer = bytearray(b"a" * 300_000)
    original = kvcache.transfer.scatter

    def scatter_after_a_change(targets: list, pieces: tuple) -> None:
        buffer[0] = ord("z")  # what a racing writer to the caller's buffer would do
        original(targets, pieces)

    kvcache.transfer.scatter = scatter_after_a_change
    try:
        pool.put("raced", memoryview(buffer))
    finally:
        kvcache.transfer.scatter = original
    assert any("'raced'" in p for p in pool.check())


# ------------------------------------------- the read fields are covered too


def _record(pool: kvcache.Pool, key: str | bytes) -> tuple[int, memoryview]:
    eid = pool._engine.table.index.find(*_hash(key if isinstance(key, bytes) else key.encode()))
    assert eid >= 0
    return eid, pool._engine.views.entries_q


def test_the_checksum_is_the_documented_formula() -> None:
    """As docs/snapshot-format.md says: XXH3-64 of four little-endian int64 fields, then bytes."""
    pieces = [b"key", b"", b"value"]
    expected = xxhash.xxh3_64(struct.pack("<4q", 1, 3, 0, 5) + b"keyvalue").intdigest()
    assert transfer.checksum(pieces, 1, 3, 0, 5) == expected
    others = {
        transfer.checksum(pieces, *fields) for fields in [(0, 3, 0, 5), (1, 4, 0, 4), (1, 3, 1, 4)]
    }
    assert expected not in others and len(others) == 3  # same bytes, other fields: other sums


def test_bug_value_len_changed_within_its_pages_passed_check(make_pool: Maker) -> None:
    """Regression: a value_len changed without changing the page count passed check() and
    repair, and get returned a value of the wrong length. Caught since the per-entry
    checksums (the sum then covers other bytes); see below for changes
    that leave the summed bytes as they were."""
    pool = make_pool("4M", page_size="4K")
    pool.put("k", b"v" * 5000)  # 2 pages of 4 KiB, as 6000 bytes would be
    eid, q = _record(pool, "k")
    q[eid * ENTRY_WORDS + E.value_len] = 6000
    problems = pool.check()
    assert len(problems) == 1 and "'k'" in problems[0] and "checksum" in problems[0]
    assert pool.check(repair=True) == problems
    assert pool.get("k") is None and pool.check() == []


@pytest.mark.parametrize(
    ("key", "value", "changes"),
    [
        # the same bytes split differently between key and value
        ("ab", b"x" * 100, {"key_len": +1, "value_len": -1}),
        # between the array's header and its payload
        ("arr", np.arange(10, dtype=np.int64), {"header_len": +1, "value_len": -1}),
        # a bytes key that happens to be UTF-8, read back as text
        (b"bytes", b"y" * 10, {"flags": KEY_IS_STR}),
        # a text key read back as bytes
        ("text", b"z" * 10, {"flags": -KEY_IS_STR}),
    ],
)
def test_changed_read_fields_are_found_by_check(
    make_pool: Maker, key: str | bytes, value: object, changes: dict[str, int]
) -> None:
    """Each change leaves the hashed bytes as they were: only the fields tell."""
    pool = make_pool("4M", page_size="4K")
    pool.put(key, value)  # type: ignore[arg-type]
    eid, q = _record(pool, key)
    for field, delta in changes.items():
        q[eid * ENTRY_WORDS + getattr(E, field)] += delta
    problems = pool.check()  # the checksum, or first a key hash that no longer fits
    assert any(f"entry {eid}" in p or "checksum" in p for p in problems), problems
    pool.check(repair=True)
    assert pool.get(key) is None and pool.check() == []
