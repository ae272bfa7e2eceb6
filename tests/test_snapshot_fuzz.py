"""Damaged, truncated and foreign snapshot files: restore fails cleanly or skips exactly.

The oracle comes from the file layout: the header checksum covers the header
and the entry table, and every entry's bytes carry their own checksum. So a
change anywhere in the header or the table must be a ``SnapshotError``, and a
change only in the data must restore every entry except the ones whose bytes
changed, which ``RestoreReport.skipped`` must name. Every restore here targets
a live pool with ``replace=True``: when it fails, that pool must be untouched
(same segment, same values) and no hidden temporary segment may be left.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kvcache
from kvcache import SnapshotError
from kvcache.cli import run
from kvcache.config import PoolConfig
from kvcache.pool import ENTRY_SORTS
from kvcache.snapshot.format import (
    HEADER_BYTES,
    HEADER_DTYPE,
    RECORD_DTYPE,
    encode_header,
    pool_checksum,
)

SHM = Path(os.environ.get("KVCACHE_SHM_DIR", "/dev/shm"))
FAR_FUTURE_TTL = 10**7  # restores use the real clock: nothing may expire meanwhile


def unique_name(tag: str) -> str:
    return f"test-fuzz-{tag}-{uuid.uuid4().hex[:10]}"


def hidden_segments(name: str) -> list[str]:
    return [f for f in os.listdir(SHM) if f.startswith(f".kvcache.{name}.")]


def same_value(got: object, expected: object) -> bool:
    if isinstance(expected, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == expected.dtype
            and got.shape == expected.shape
            and got.tobytes() == expected.tobytes()
        )
    return type(got) is bytes and got == expected


def write_file(path: Path, raw: bytes) -> None:
    """A new file each time: truncating one in place makes ext4 flush it (auto_da_alloc)."""
    path.unlink(missing_ok=True)
    path.write_bytes(raw)


# ------------------------------------------------------------------ fixtures


@dataclass
class Snapshot:
    """A real snapshot file's bytes, the values it holds and where each entry lies."""

    raw: bytes
    values: dict[str | bytes, object]
    keys: list[str | bytes]  # by record index
    ranges: list[tuple[int, int]]  # file offsets [start, end) of each entry's bytes
    records_offset: int

    def damaged_entries(self, positions: list[int]) -> set[int] | None:
        """Record indexes whose bytes include ``positions``; None if the header or table did."""
        if any(p < HEADER_BYTES or p >= self.records_offset for p in positions):
            return None
        return {i for i, (a, b) in enumerate(self.ranges) for p in positions if a <= p < b}


def take_snapshot(folder: Path, values: dict[str | bytes, object], **create: object) -> Snapshot:
    name = unique_name("src")
    pool = kvcache.create(name, **create)  # type: ignore[arg-type]
    try:
        for i, (key, value) in enumerate(values.items()):
            pool.put(key, value, priority=i, ttl=FAR_FUTURE_TTL + i)  # type: ignore[arg-type]
        path = kvcache.persist(pool, folder / f"{name}.kvsnap")
    finally:
        pool.close()
        kvcache.destroy(name)
    raw = path.read_bytes()
    path.unlink()
    header = np.frombuffer(raw[: HEADER_DTYPE.itemsize], HEADER_DTYPE)[0]
    records_offset = int(header["records_offset"])
    records = np.frombuffer(raw[records_offset:], RECORD_DTYPE)
    keys: list[str | bytes] = []
    ranges = []
    for record in records:
        start = HEADER_BYTES + int(record["offset"])
        key = raw[start : start + int(record["key_len"])]
        keys.append(key.decode() if int(record["flags"]) & 1 else key)
        ranges.append(
            (start, start + int(record["key_len"] + record["header_len"] + record["value_len"]))
        )
    assert sorted(map(repr, keys)) == sorted(map(repr, values))
    return Snapshot(raw, values, keys, ranges, records_offset)


def small_values() -> dict[str | bytes, object]:
    rng = np.random.default_rng(2024)
    return {
        "text": rng.bytes(300),
        b"\x00bin": b"",  # a damaged empty value can only be caught in its key
        "multi-page": rng.bytes(2500),
        "arr": rng.standard_normal((10, 10)).astype(np.float32),
        "arr-empty": np.zeros((0, 3), np.int16),
        "u": b"\x01",
        "ключ": rng.bytes(1500),
        b"k" * 50: rng.bytes(700),
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    """About 7 KiB: small enough to cut at every byte."""
    return take_snapshot(
        tmp_path_factory.mktemp("small"), small_values(), size="64K", page_size="1K"
    )


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    """About 600 KiB, with values of many 4 KiB pages."""
    rng = np.random.default_rng(77)
    values: dict[str | bytes, object] = {
        f"v{i}": rng.bytes(int(size)) for i, size in enumerate([0, 1, 4095, 4096, 70_000])
    }
    values["big-array"] = rng.standard_normal((300, 256)).astype(np.float64)  # 600 KiB
    values[b"raw"] = rng.bytes(9000)
    return take_snapshot(tmp_path_factory.mktemp("medium"), values, size="2M", page_size="4K")


class LivePool:
    """The pool every damaged restore tries to replace."""

    VALUES: ClassVar[dict[str | bytes, object]] = {
        "live-a": b"A" * 3000,
        "live-b": b"",
        b"live-c": np.arange(50, dtype=np.int64),
    }

    def __init__(self) -> None:
        self.name = unique_name("live")
        self.pool = self._create()

    def _create(self) -> kvcache.Pool:
        pool = kvcache.create(self.name, "64K", page_size="1K", policy="fifo")
        for key, value in self.VALUES.items():
            pool.put(key, value)  # type: ignore[arg-type]
        self.inode = (SHM / f"kvcache.{self.name}").stat().st_ino
        return pool

    def assert_untouched(self) -> None:
        assert (SHM / f"kvcache.{self.name}").stat().st_ino == self.inode  # not replaced
        assert sorted(map(repr, self.pool.keys())) == sorted(map(repr, self.VALUES))
        for key, value in self.VALUES.items():
            assert same_value(self.pool.get(key), value)
        assert hidden_segments(self.name) == []

    def reset(self) -> None:
        """After a restore replaced it: back to the original contents."""
        self.pool.close()
        kvcache.destroy(self.name)
        self.pool = self._create()

    def close(self) -> None:
        self.pool.close()
        if self.name in kvcache.list_pools():
            kvcache.destroy(self.name)
        assert hidden_segments(self.name) == []


@pytest.fixture(scope="module")
def live() -> Iterator[LivePool]:
    pool = LivePool()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("damaged") / "damaged.kvsnap"


def restore_damaged(
    live: LivePool, path: Path, snapshot: Snapshot, raw: bytes, positions: list[int]
) -> str:
    """Restore ``raw`` over the live pool and check the outcome; return 'error' or 'restored'."""
    write_file(path, raw)
    expected = snapshot.damaged_entries(positions)
    try:
        pool, report = kvcache.restore_with_report(live.name, path, replace=True)
    except SnapshotError:
        assert expected is None, f"changes at {positions} hit only data, yet the file was refused"
        live.assert_untouched()
        return "error"
    try:
        assert expected is not None, f"changes at {positions} in header/table went unnoticed"
        skipped = {int(m) for m in re.findall(r"entry (\d+) ", " ".join(report.skipped))}
        assert skipped == expected
        assert len(report.skipped) == len(expected)
        assert report.num_restored == len(snapshot.keys) - len(expected)
        survivors = [k for i, k in enumerate(snapshot.keys) if i not in expected]
        assert sorted(map(repr, pool.keys())) == sorted(map(repr, survivors))
        for key in survivors:  # every restored value is exactly the original
            assert same_value(pool.get(key), snapshot.values[key])
        assert pool.check() == []
        assert hidden_segments(live.name) == []
    finally:
        pool.close()
        live.reset()
    return "restored"


# ---------------------------------------------------------------- truncation


def test_truncation_at_every_byte_is_refused(small, live, scratch):
    for length in range(len(small.raw)):
        write_file(scratch, small.raw[:length])
        with pytest.raises(SnapshotError):
            kvcache.restore(live.name, scratch, replace=True)
        with pytest.raises(SnapshotError):
            kvcache.inspect_snapshot(scratch)
        live.assert_untouched()


def test_truncation_of_a_larger_file_at_boundaries_and_random_places(medium, live, scratch):
    rng = np.random.default_rng(5)
    cuts = {0, 1, 8, 16, 511, 512, 513, medium.records_offset - 1, medium.records_offset}
    cuts |= {medium.records_offset + 88 * i + d for i in range(8) for d in (-1, 0, 1)}
    cuts |= {a + d for a, b in medium.ranges for d in (-1, 0, 1)}
    cuts |= set(rng.integers(0, len(medium.raw), 200).tolist())
    cuts = {c for c in cuts if 0 <= c < len(medium.raw)}
    for length in sorted(cuts):
        write_file(scratch, medium.raw[:length])
        with pytest.raises(SnapshotError, match="snapshot"):
            kvcache.restore(live.name, scratch, replace=True)
        live.assert_untouched()


def test_truncated_then_zero_padded_to_full_length_is_refused(small, live, scratch):
    for length in range(small.records_offset, len(small.raw), 7):  # the table is cut
        padded = small.raw[:length].ljust(len(small.raw), b"\0")
        if padded != small.raw:
            assert restore_damaged(live, scratch, small, padded, [length]) == "error"


# ---------------------------------------------------------------- bit flips


def flipped(raw: bytes, positions: list[int], masks: list[int]) -> bytes:
    data = bytearray(raw)
    for position, mask in zip(positions, masks, strict=True):
        data[position] ^= mask
    return bytes(data)


def test_one_bit_flipped_in_every_header_and_table_byte_is_refused(small, live, scratch):
    table = range(small.records_offset, len(small.raw))
    for position in [*range(HEADER_BYTES), *table]:
        bit = 1 << (position % 8)
        raw = flipped(small.raw, [position], [bit])
        assert restore_damaged(live, scratch, small, raw, [position]) == "error"


def test_flips_in_each_entry_skip_exactly_that_entry(small, live, scratch):
    """Key, value header and payload of every entry, first, middle and last byte."""
    for start, end in small.ranges:
        for position in sorted({start, (start + end) // 2, end - 1}):
            raw = flipped(small.raw, [position], [0x80 >> (position % 8)])
            assert restore_damaged(live, scratch, small, raw, [position]) == "restored"
    # two entries at once, and every entry at once
    first, last = small.ranges[0][0], small.ranges[-1][1] - 1
    assert (
        restore_damaged(
            live, scratch, small, flipped(small.raw, [first, last], [1, 1]), [first, last]
        )
        == "restored"
    )
    everywhere = [a for a, _ in small.ranges]
    raw = flipped(small.raw, everywhere, [0xFF] * len(everywhere))
    assert restore_damaged(live, scratch, small, raw, everywhere) == "restored"


FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(data=st.data())
def test_random_flips_fail_cleanly_or_skip_exactly_the_damaged(small, live, scratch, data):
    size = len(small.raw)
    region = data.draw(st.sampled_from(["header", "data", "data", "table", "anywhere"]))
    low, high = {
        "header": (0, HEADER_BYTES),
        "data": (HEADER_BYTES, small.records_offset),
        "table": (small.records_offset, size),
        "anywhere": (0, size),
    }[region]
    positions = data.draw(st.lists(st.integers(low, high - 1), min_size=1, max_size=5, unique=True))
    masks = data.draw(
        st.lists(st.integers(1, 255), min_size=len(positions), max_size=len(positions))
    )
    outcome = restore_damaged(live, scratch, small, flipped(small.raw, positions, masks), positions)
    event(f"{region}: {outcome}")
    assert outcome == ("restored" if small.damaged_entries(positions) is not None else "error")


@FUZZ
@given(data=st.data())
def test_random_bursts_of_garbage_fail_cleanly_or_skip_exactly(medium, live, scratch, data):
    size = len(medium.raw)
    start = data.draw(st.integers(0, size - 1))
    garbage = data.draw(st.binary(min_size=1, max_size=min(4096, size - start)))
    raw = medium.raw[:start] + garbage + medium.raw[start + len(garbage) :]
    changed = [start + i for i, b in enumerate(garbage) if b != medium.raw[start + i]]
    if changed:
        event(restore_damaged(live, scratch, medium, raw, changed))


# ------------------------------------------------------------- foreign files


def patched(raw: bytes, field: str, value: int) -> bytes:
    """``raw`` with one int64 header field replaced (the checksum no longer matches)."""
    offset = HEADER_DTYPE.fields[field][1]  # type: ignore[index]
    return raw[:offset] + int(value).to_bytes(8, "little", signed=True) + raw[offset + 8 :]


def crafted(entries: list[dict[str, int]], data: bytes, **config_fields: object) -> bytes:
    """A snapshot whose header and table checksums are right, whatever the records say.

    Each entry gives record fields; unspecified ones default to a well-formed
    entry (checksum of its bytes computed when they lie inside ``data``).
    """
    config = PoolConfig(size_bytes=64 << 10, page_size_bytes=1024)
    records = np.zeros(len(entries), RECORD_DTYPE)
    for record, fields in zip(records, entries, strict=True):
        record["expires_at"] = np.inf
        for name, value in fields.items():
            record[name] = value
        offset, length = int(record["offset"]), int(record["key_len"]) + int(record["value_len"])
        if offset >= 0 and offset + length <= len(data):
            record["checksum"] = pool_checksum(record, [data[offset : offset + length]])
    header = bytearray(encode_header("crafted", config, 0.0, 10, records, len(data), mode=0o600))
    for name, value in config_fields.items():  # break the config, then re-seal the header
        offset, size = HEADER_DTYPE.fields[name][1], HEADER_DTYPE.fields[name][0].itemsize  # type: ignore[index]
        header[offset : offset + size] = (
            value if isinstance(value, bytes) else int(value).to_bytes(8, "little", signed=True)
        ).ljust(size, b"\0")
        header = bytearray(_resealed(bytes(header), records))
    return bytes(header) + data + records.tobytes()


def _resealed(header: bytes, records: np.ndarray) -> bytes:
    import xxhash

    offset = HEADER_DTYPE.fields["checksum"][1]  # type: ignore[index]
    zeroed = header[:offset] + bytes(8) + header[offset + 8 :]
    digest = xxhash.xxh3_64()
    digest.update(zeroed)
    digest.update(records.tobytes())
    return zeroed[:offset] + digest.intdigest().to_bytes(8, "little") + zeroed[offset + 8 :]


DATA = b"key1" + b"v" * 60 + b"key2" + b"w" * 30


def foreign_files(real: bytes) -> dict[str, tuple[bytes, str]]:
    """name -> (file contents, what the error must say)."""
    rng = np.random.default_rng(13)
    json_doc = json.dumps({"name": "pool", "entries": [{"k": i, "v": "x" * 20} for i in range(30)]})
    v3 = patched(real, "format_version", 3)
    ok = {"key_len": 4, "value_len": 60}
    second = {"offset": 64, "key_len": 4, "value_len": 30}
    return {
        "empty file": (b"", "not a kvcache snapshot"),
        "100 random bytes": (rng.bytes(100), "not a kvcache snapshot"),
        "64 KiB of random bytes": (rng.bytes(64 << 10), "not a kvcache snapshot"),
        "a JSON file": (json_doc.encode(), "not a kvcache snapshot"),
        "right magic, version 3": (v3, "version 3"),
        "right magic, version 2**40": (patched(real, "format_version", 2**40), "version"),
        "num_records 2**40": (patched(real, "num_records", 2**40), "do not add up"),
        "num_records -1": (patched(real, "num_records", -1), "do not add up"),
        "data_bytes 2**62": (patched(real, "data_bytes", 2**62), "do not add up"),
        "data_bytes -1": (patched(real, "data_bytes", -1), "do not add up"),
        "records_offset off by one": (
            patched(real, "records_offset", len(real) - 87),
            "do not add up",
        ),
        "header_bytes 1024": (patched(real, "header_bytes", 1024), "do not add up"),
        "one extra byte": (real + b"\0", "do not add up"),
        "checksum field zeroed": (patched(real, "checksum", 0), "checksum"),
        "sealed: key_len 0": (crafted([{"key_len": 0, "value_len": 64}, second], DATA), "outside"),
        "sealed: key_len 2000": (crafted([{"key_len": 2000}, second], DATA), "outside"),
        "sealed: value_len 2**62": (
            crafted([{"key_len": 4, "value_len": 2**62}, second], DATA),
            "outside",
        ),
        "sealed: value_len 2**63-1": (
            crafted([{"key_len": 4, "value_len": 2**63 - 1}, second], DATA),
            "outside",
        ),
        "sealed: offset 2**63-5": (crafted([ok, {**second, "offset": 2**63 - 5}], DATA), "outside"),
        "sealed: negative offset": (crafted([ok, {**second, "offset": -4}], DATA), "outside"),
        "sealed: past the data": (crafted([ok, {**second, "offset": 70}], DATA), "outside"),
        "sealed: overlapping": (crafted([ok, {**second, "offset": 60}], DATA), "outside"),
        "sealed: header_len 100000": (
            crafted([{"key_len": 4, "header_len": 100_000}, second], DATA),
            "outside",
        ),
        "sealed: unknown flags": (crafted([{**ok, "flags": 4}, second], DATA), "outside"),
        "sealed: policy 'bogus'": (crafted([ok, second], DATA, policy=b"bogus"), "configuration"),
        "sealed: page size 3000": (
            crafted([ok, second], DATA, page_size_bytes=3000),
            "configuration",
        ),
        "sealed: size 0": (crafted([ok, second], DATA, size_bytes=0), "configuration"),
    }


def test_crafted_helper_makes_a_valid_snapshot(live, scratch):
    """Control: the sealed files below fail for their defect, not for the sealing."""
    raw = crafted(
        [{"key_len": 4, "value_len": 60}, {"offset": 64, "key_len": 4, "value_len": 30}], DATA
    )
    write_file(scratch, raw)
    name = unique_name("crafted")
    pool, report = kvcache.restore_with_report(name, scratch)
    try:
        assert (report.num_restored, report.skipped) == (2, [])
        assert pool.get(b"key1") == b"v" * 60
        assert pool.get(b"key2") == b"w" * 30
    finally:
        pool.close()
        kvcache.destroy(name)


@pytest.mark.parametrize("case", list(foreign_files(b"\0" * 1024)))
def test_foreign_file_is_a_clear_error_in_bounded_time_and_memory(small, live, scratch, case):
    raw, message = foreign_files(small.raw)[case]
    write_file(scratch, raw)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(SnapshotError, match=message):
            kvcache.restore(live.name, scratch, replace=True)
        with pytest.raises(SnapshotError, match=message):
            kvcache.inspect_snapshot(scratch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 5
    assert peak < 4 * len(raw) + (1 << 20)  # never sized by what the file claims
    live.assert_untouched()


def test_bug_record_offset_overflow_crashed_restore(pool_name, scratch):
    """Regression: offset + length wrapped around int64, so the bounds check passed and
    the restore died with OverflowError (reading at offset 2**63) instead of SnapshotError."""
    write_file(
        scratch,
        crafted(
            [{"key_len": 4, "value_len": 60}, {"offset": 2**63 - 5, "key_len": 4, "value_len": 30}],
            DATA,
        ),
    )
    with pytest.raises(SnapshotError, match="outside"):
        kvcache.restore(pool_name, scratch)
    assert pool_name not in kvcache.list_pools()
    assert hidden_segments(pool_name) == []


# ------------------------------------------------------------ resealed edits
#
# Checksums prove that bytes are the ones written, not that what was written
# makes sense. Here a field is edited and every checksum is then recomputed
# (the entry's over its bytes and read fields, the header's over header and
# table), as a tool that means to would: only the meaning of the fields is
# left to catch it. The oracle: a SnapshotError that leaves the live pool
# alone, or a restored pool that works in every way and checks clean.


@dataclass
class Opened:
    """A snapshot file taken apart, to edit and seal again."""

    header: np.ndarray  # 0-d, a copy
    records: np.ndarray  # a copy
    data: bytearray

    @classmethod
    def of(cls, raw: bytes) -> Opened:
        header = np.frombuffer(raw[: HEADER_DTYPE.itemsize], HEADER_DTYPE)[0].copy()
        records_offset = int(header["records_offset"])
        records = np.frombuffer(raw[records_offset:], RECORD_DTYPE).copy()
        return cls(header, records, bytearray(raw[HEADER_BYTES:records_offset]))

    def sealed(self) -> bytes:
        """The file, with every checksum recomputed for what it now says."""
        for record in self.records:
            start = int(record["offset"])
            end = start + sum(int(record[n]) for n in ("key_len", "header_len", "value_len"))
            if 0 <= start <= end <= len(self.data):
                record["checksum"] = pool_checksum(record, [bytes(self.data[start:end])])
        header = self.header.tobytes().ljust(HEADER_BYTES, b"\0")
        return _resealed(header, self.records) + bytes(self.data) + self.records.tobytes()

    def index(self, key: str | bytes) -> int:
        """The record index of ``key``."""
        encoded = key.encode() if isinstance(key, str) else key
        for i, record in enumerate(self.records):
            start = int(record["offset"])
            if bytes(self.data[start : start + int(record["key_len"])]) == encoded:
                return i
        raise KeyError(key)


def restore_resealed(live: LivePool, path: Path, raw: bytes) -> kvcache.RestoreReport | None:
    """Restore ``raw`` over the live pool; None if refused. A restored pool must be sound.

    Besides a damaged file, a refusal may be a pool the file validly asks for
    but this machine cannot give (a size of 2**40), or a mode that needs ``force``.
    """
    write_file(path, raw)
    try:
        pool, report = kvcache.restore_with_report(live.name, path, replace=True)
    except (SnapshotError, kvcache.OutOfSharedMemoryError, kvcache.InvalidArgument):
        live.assert_untouched()
        return None
    try:
        assert_sound(pool, report, len(Opened.of(raw).records))
    finally:
        pool.close()
        live.reset()
    return report


def assert_sound(pool: kvcache.Pool, report: kvcache.RestoreReport, num_records: int) -> None:
    """Everything works on a restored pool and it checks clean; then (closed) ``cortex
    cache entries`` lists it."""
    accounted = report.num_restored + report.num_expired + report.num_dropped + len(report.skipped)
    assert accounted == num_records
    keys = pool.keys()
    assert len(keys) == len(pool) == report.num_restored
    assert all(pool.get(key) is not None for key in keys)
    for sort in ENTRY_SORTS:
        assert len(pool.entries(sort=sort)) == len(keys)
    assert pool.check() == []
    pool.put("fresh", b"new")  # every later put and get keeps working
    assert pool.get("fresh") == b"new"
    pool.evict(percent=50)
    assert pool.check() == []
    pool.close()  # the file may allow as few as one process
    with contextlib.redirect_stdout(io.StringIO()):
        assert run(["entries", pool.name]) == 0


RECORD_VALUES = [0, 1, -1, 2, 1023, 1024, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]
FLOAT_VALUES = [0.0, -1.0, -0.0, 1e300, float("nan"), float("inf"), float("-inf")]


def edited_values(kind: str, old: object) -> list[object]:
    if kind == "f":
        return FLOAT_VALUES
    return sorted({*RECORD_VALUES, int(old) - 1, int(old) + 1})  # type: ignore[call-overload]


def test_resealed_edit_of_every_record_field_is_refused_or_restores_a_sound_pool(
    small, live, scratch
):
    base = Opened.of(small.raw)
    outcomes: dict[str, set[str]] = {}
    for name in RECORD_DTYPE.names:
        if name == "checksum":
            continue  # recomputed by the sealing
        kind = RECORD_DTYPE.fields[name][0].kind  # type: ignore[index]
        for index in (0, len(base.records) - 1):
            for value in edited_values(kind, base.records[name][index]):
                snap = Opened.of(small.raw)
                snap.records[name][index] = value
                report = restore_resealed(live, scratch, snap.sealed())
                outcome = "refused" if report is None else f"{len(report.skipped)} skipped"
                outcomes.setdefault(name, set()).add(outcome)
    # every field is looked at: each can be made to refuse the file or skip the entry
    assert all(len(seen) > 1 or "refused" in seen for seen in outcomes.values()), outcomes


def test_resealed_edit_of_every_header_field_is_refused_or_restores_a_sound_pool(
    small, live, scratch
):
    for name in HEADER_DTYPE.names:
        if name in ("checksum", "magic"):
            continue
        kind = HEADER_DTYPE.fields[name][0].kind  # type: ignore[index]
        if kind == "S":
            values: list[object] = [b"", b"\xff\xfe", b"lfu", b"x" * 16]
        else:
            values = edited_values(kind, Opened.of(small.raw).header[name])
        for value in values:
            snap = Opened.of(small.raw)
            snap.header[name] = value
            restore_resealed(live, scratch, snap.sealed())


@FUZZ
@given(data=st.data())
def test_random_resealed_edits_are_refused_or_restore_a_sound_pool(small, live, scratch, data):
    snap = Opened.of(small.raw)
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(snap.records) - 1))
        name = data.draw(st.sampled_from([n for n in RECORD_DTYPE.names if n != "checksum"]))
        if RECORD_DTYPE.fields[name][0].kind == "f":  # type: ignore[index]
            snap.records[name][index] = data.draw(st.floats())
        else:
            snap.records[name][index] = data.draw(st.integers(-(2**63), 2**63 - 1))
    if data.draw(st.booleans()):  # and some bytes of the data
        position = data.draw(st.integers(0, len(snap.data) - 1))
        snap.data[position] = data.draw(st.integers(0, 255))
    report = restore_resealed(live, scratch, snap.sealed())
    event("refused" if report is None else f"{len(report.skipped)} skipped")


def test_bug_resealed_text_key_that_is_not_utf8_crashed_keys_and_entries(live, scratch, small):
    """Regression: a key flagged as text whose bytes are not UTF-8 restored "fine";
    keys() and `kvcache entries` then raised UnicodeDecodeError."""
    snap = Opened.of(small.raw)
    index = snap.index("ключ")
    snap.data[int(snap.records["offset"][index])] = 0xFF
    report = restore_resealed(live, scratch, snap.sealed())
    assert report is not None and len(report.skipped) == 1
    assert report.skipped[0].startswith(f"entry {index} ") and "not UTF-8" in report.skipped[0]


@pytest.mark.parametrize("field", ["last_access", "created"])
def test_bug_resealed_clock_values_past_the_clock_broke_every_later_put(
    live, scratch, small, field
):
    """Regression: a last_access (or created) of 2**63-1 restored, and every later
    get or put then raised ValueError (the clock could not tick past it)."""
    snap = Opened.of(small.raw)
    snap.records[field][0] = 2**63 - 1
    report = restore_resealed(live, scratch, snap.sealed())
    assert report is not None and len(report.skipped) == 1
    assert report.skipped[0].startswith("entry 0 ") and "clock" in report.skipped[0]


def test_bug_resealed_clock_of_2_63_broke_every_later_put(live, scratch, small):
    snap = Opened.of(small.raw)
    snap.header["clock"] = 2**63 - 1
    with pytest.raises(SnapshotError, match="clock"):
        kvcache.restore(live.name, _written(scratch, snap.sealed()), replace=True)
    live.assert_untouched()


def test_flags_are_covered_by_the_entry_checksum(live, scratch, small):
    """A text key turned into a bytes key, with only the header resealed: the entry's
    own checksum no longer matches, so it is skipped."""
    snap = Opened.of(small.raw)
    index = snap.index("text")
    snap.records["flags"][index] &= ~1
    header = snap.header.tobytes().ljust(HEADER_BYTES, b"\0")
    raw = _resealed(header, snap.records) + bytes(snap.data) + snap.records.tobytes()
    report = restore_resealed(live, scratch, raw)
    assert report is not None
    assert [s.split(" ")[1] for s in report.skipped] == [str(index)]
    assert "checksum" in report.skipped[0]


def _written(path: Path, raw: bytes) -> Path:
    write_file(path, raw)
    return path
