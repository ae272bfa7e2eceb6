"""The snapshot file format (version 2), and validation of everything read back.

All integers are little-endian; the full description is in ``docs/snapshot-format.md``::

    offset 0          +------------------------------+
                      | header (512 bytes)           |  magic "KVSNAP\\0\\1", version,
                      |                              |  pool name, configuration, mode,
                      |                              |  counts, offsets, checksum
    512               +------------------------------+
                      | data (data_bytes)            |  each entry's key | value header |
                      |                              |  payload, back to back
    records_offset    +------------------------------+
                      | records (num_records x 88 B) |  where each entry's bytes are,
                      |                              |  its metadata and xxh3-64 checksum
    end of file       +------------------------------+

The header's checksum is xxh3-64 over the header (checksum field zeroed) and
the records, so any damage to either is caught before a byte of data is
trusted; each entry's bytes carry their own checksum, so a damaged entry is
skipped alone. The records come last so the writer can stream data without
knowing in advance which entries will still be live when it reaches them.

Checksums prove that bytes are the ones written, not that what was written
makes sense: a file edited and then resealed passes them. So every field is
also checked for its meaning (a clock within range, frequencies finite,
lengths that agree with the flags, text keys that are UTF-8): a bad header
is a ``SnapshotError``, a bad record is skipped and reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import xxhash

from .. import codec, transfer
from ..config import MAX_KEY_BYTES, PoolConfig
from ..errors import CorruptPoolError, InvalidArgument, SnapshotError
from ..layout import CLOCK_LIMIT, KEY_IS_STR, KNOWN_FLAGS
from ..ranges import MAX_VALUE_HEADER_BYTES, entry_faults

MAGIC = b"KVSNAP\x00\x01"
FORMAT_VERSION = 2
"""2: an entry's checksum also covers its flags and lengths (``transfer.checksum``)."""
READ_VERSIONS = (1, 2)
"""Version 1 (an entry's checksum covers its bytes only) differs in nothing else: still read."""
HEADER_BYTES = 512
MAX_NAME_BYTES = 128

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("format_version", "<i8"),
        ("header_bytes", "<i8"),
        ("name", f"S{MAX_NAME_BYTES}"),
        ("created_at", "<f8"),  # wall clock when the snapshot was taken
        ("size_bytes", "<i8"),
        ("page_size_bytes", "<i8"),
        ("max_entries", "<i8"),
        ("policy", "S16"),
        ("default_ttl_s", "<f8"),  # 0 = none
        ("eviction_samples", "<i8"),
        ("lfu_half_life", "<i8"),
        ("max_processes", "<i8"),
        ("clock", "<i8"),  # the pool's logical clock, so recency survives
        ("num_records", "<i8"),
        ("data_offset", "<i8"),
        ("data_bytes", "<i8"),
        ("records_offset", "<i8"),
        ("checksum", "<u8"),
        # Added within version 1, in what was the zeroed tail: 0 = not recorded
        # (an older writer), restored as 0600. Older readers ignore it.
        ("mode", "<i8"),  # the pool file's permission bits
        ("inline_bytes", "<i8"),  # the pool's inline slots (0 = none, or an older writer)
    ]
)
assert HEADER_DTYPE.itemsize <= HEADER_BYTES

RECORD_DTYPE = np.dtype(
    [
        ("offset", "<i8"),  # of the entry's bytes, from the start of the data region
        ("key_len", "<i8"),
        ("header_len", "<i8"),
        ("value_len", "<i8"),
        ("flags", "<i8"),
        ("priority", "<i8"),
        ("expires_at", "<f8"),  # wall clock; inf = never
        ("last_access", "<i8"),
        ("created", "<i8"),
        ("freq", "<f8"),
        ("checksum", "<u8"),  # xxh3-64 of key | value header | payload
    ]
)


def encode_header(
    name: str,
    config: PoolConfig,
    created_at: float,
    clock: int,
    records: np.ndarray,
    data_bytes: int,
    *,
    mode: int,
) -> bytes:
    """The 512-byte header for ``records`` (already in file order)."""
    header = np.zeros((), HEADER_DTYPE)
    header["magic"] = MAGIC
    header["format_version"] = FORMAT_VERSION
    header["header_bytes"] = HEADER_BYTES
    header["name"] = name.encode()
    header["mode"] = mode
    header["created_at"] = created_at
    for field in (
        "size_bytes",
        "page_size_bytes",
        "max_entries",
        "eviction_samples",
        "lfu_half_life",
        "max_processes",
        "inline_bytes",
    ):
        header[field] = getattr(config, field)
    header["policy"] = config.policy.encode()
    header["default_ttl_s"] = config.default_ttl_s or 0.0
    header["clock"] = clock
    header["num_records"] = len(records)
    header["data_offset"] = HEADER_BYTES
    header["data_bytes"] = data_bytes
    header["records_offset"] = HEADER_BYTES + data_bytes
    header["checksum"] = _checksum(_padded(header), records.tobytes())
    return _padded(header)


def _padded(header: np.ndarray) -> bytes:
    return header.tobytes().ljust(HEADER_BYTES, b"\0")


def _checksum(header_bytes: bytes, record_bytes: bytes) -> int:
    digest = xxhash.xxh3_64()
    digest.update(header_bytes)
    digest.update(record_bytes)
    return digest.intdigest()


def decode_header(raw: bytes, file_bytes: int, where: str) -> tuple[np.ndarray, PoolConfig]:
    """Check a header's identity and geometry against the file size.

    Returns:
        The header (a 0-d structured array) and the pool configuration it holds.

    Raises:
        SnapshotError: not a snapshot, another version, or inconsistent sizes.
    """
    if len(raw) < HEADER_BYTES or file_bytes < HEADER_BYTES:
        raise SnapshotError(f"{where} is not a kvcache snapshot (too short): check the path")
    header = np.frombuffer(raw[: HEADER_DTYPE.itemsize], HEADER_DTYPE)[0]
    if header["magic"] != MAGIC:
        raise SnapshotError(f"{where} is not a kvcache snapshot: check the path")
    version = int(header["format_version"])
    if version not in READ_VERSIONS:
        raise SnapshotError(
            f"{where} is snapshot format version {version}; this kvcache reads versions "
            f"{' and '.join(map(str, READ_VERSIONS))}: restore it with the kvcache that wrote it"
        )
    num_records, data_bytes = int(header["num_records"]), int(header["data_bytes"])
    if (
        int(header["header_bytes"]) != HEADER_BYTES
        or int(header["data_offset"]) != HEADER_BYTES
        or not 0 <= num_records <= file_bytes // RECORD_DTYPE.itemsize
        or not 0 <= data_bytes <= file_bytes
        or int(header["records_offset"]) != HEADER_BYTES + data_bytes
        or HEADER_BYTES + data_bytes + num_records * RECORD_DTYPE.itemsize != file_bytes
    ):
        raise SnapshotError(
            f"{where} is truncated or damaged (its sizes do not add up): take a new snapshot"
        )
    try:
        config = PoolConfig.from_stored(header, int(header["size_bytes"]))
    except (InvalidArgument, UnicodeDecodeError) as exc:
        raise SnapshotError(
            f"{where} has a damaged pool configuration ({exc}): take a new snapshot"
        ) from exc
    problem = _header_problem(header)
    if problem:
        raise SnapshotError(f"{where} has a damaged header ({problem}): take a new snapshot")
    return header, config


def _header_problem(header: np.void) -> str | None:
    """What is meaningless in a header whose identity and sizes are right, or None."""
    clock, mode = int(header["clock"]), int(header["mode"])
    if not 0 <= clock < CLOCK_LIMIT:
        return f"logical clock {clock} is out of range"
    if not math.isfinite(float(header["created_at"])):
        return "its creation time is not a number"
    if not 0 <= mode <= 0o777:
        return f"mode {mode:#o} is not permission bits"
    return None


def check_records(
    header: np.ndarray, raw_header: bytes, record_bytes: bytes, where: str
) -> np.ndarray:
    """Verify the header+records checksum, then every record's bounds.

    Returns:
        The records, as a structured array.

    Raises:
        SnapshotError: checksum mismatch or a record that points outside the data.
    """
    zeroed = bytearray(raw_header[:HEADER_BYTES])
    offset = HEADER_DTYPE.fields["checksum"][1]  # type: ignore[index]
    zeroed[offset : offset + 8] = bytes(8)
    if _checksum(bytes(zeroed), record_bytes) != int(header["checksum"]):
        raise SnapshotError(
            f"{where} is damaged (header or entry table checksum mismatch): take a new snapshot"
        )
    records = np.frombuffer(record_bytes, RECORD_DTYPE)
    data_bytes = int(header["data_bytes"])
    total = records["key_len"] + records["header_len"] + records["value_len"]
    ends = records["offset"] + total
    order = np.argsort(records["offset"], kind="stable")
    if (
        records.size
        and (
            (records["key_len"] < 1).any()
            or (records["key_len"] > MAX_KEY_BYTES).any()
            or (records["header_len"] < 0).any()
            or (records["header_len"] > MAX_VALUE_HEADER_BYTES).any()
            or (records["value_len"] < 0).any()
            or (records["offset"] < 0).any()
            or (records["offset"] > data_bytes).any()  # bounded first, so ends cannot wrap
            or (records["value_len"] > data_bytes).any()
            or (ends > data_bytes).any()
            or (records["flags"] & ~KNOWN_FLAGS).any()
            or (ends[order][:-1] > records["offset"][order][1:]).any()
        )
    ):
        raise SnapshotError(f"{where} has entries that point outside its data: take a new snapshot")
    return records


def record_problems(records: np.ndarray, clock: int) -> dict[int, str]:
    """Records whose metadata is out of range (index -> why): skipped, not restored.

    A restored entry's metadata feeds the policies and every later put and
    get (see ``kvcache.ranges``), so a resealed edit must not bring it in.
    """
    problems: dict[int, str] = {}
    for fault in entry_faults(records, clock):
        for index in np.flatnonzero(fault.bad).tolist():
            problems.setdefault(index, fault.why)
    return problems


def content_problem(record: np.void, key: bytes, value_header: bytes) -> str | None:
    """Why an entry's key or value header (read from the file) cannot be restored, or None."""
    if int(record["flags"]) & KEY_IS_STR:
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            return "its text key is not UTF-8"
    if value_header:
        try:
            codec.new_array(value_header, int(record["value_len"]))
        except CorruptPoolError as exc:
            return str(exc)
    return None


def entry_checksum(version: int, record: np.void, views: Sequence[bytes | memoryview]) -> int:
    """The checksum that a snapshot of format ``version`` records for an entry's bytes."""
    if version == 1:  # the bytes only
        digest = xxhash.xxh3_64()
        for view in views:
            digest.update(view)
        return digest.intdigest()
    return pool_checksum(record, views)


def pool_checksum(record: np.void, views: Sequence[bytes | memoryview]) -> int:
    """The checksum a pool keeps for the entry ``record`` describes (version 2's)."""
    return transfer.checksum(
        views,
        int(record["flags"]),
        int(record["key_len"]),
        int(record["header_len"]),
        int(record["value_len"]),
    )
