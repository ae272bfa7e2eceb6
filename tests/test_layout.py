"""layout: header round trip, region geometry, record formats and word indexes."""

from __future__ import annotations

import itertools
import math
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache import IncompatiblePoolError, PoolConfig
from kvcache.layout import (
    ALIGN_BYTES,
    ENTRY_DTYPE,
    ENTRY_WORDS,
    FORMAT_VERSION,
    HEADER_BYTES,
    HEADER_DTYPE,
    MAGIC,
    NO_PAGE,
    PROC_DTYPE,
    E,
    Geometry,
    H,
    Views,
    read_header,
    write_header,
)
from kvcache.policies import POLICIES

K, M, G = 1 << 10, 1 << 20, 1 << 30


def _segment(config: PoolConfig) -> tuple[mmap.mmap, Geometry]:
    geometry = Geometry.for_config(config)
    buffer = mmap.mmap(-1, geometry.total_bytes)
    write_header(buffer, config, geometry, 1234.5, reserved_pages=0)
    return buffer, geometry


CONFIGS = [
    PoolConfig.build("1M"),
    PoolConfig.build("1M", page_size="1K", policy="lfu", default_ttl="1h"),
    PoolConfig.build("64K"),  # a single page
    PoolConfig.build("3M", page_size="4K", max_entries=5, policy="priority"),
    PoolConfig.build("2M", page_size="2K", policy="size", lfu_half_life=3, eviction_samples=7),
    PoolConfig.build("1M", page_size="1K", policy="fifo", max_processes=3, max_entries=1000),
    PoolConfig.build("8M", page_size="8M", policy="ttl", default_ttl=0.25),
    PoolConfig.build("64K", page_size="1K", inline_bytes=128, max_entries=5000),
    PoolConfig.build("1M", page_size="64K", policy="prefix", inline_bytes=4096),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.policy}-{c.num_pages}p")
def test_header_round_trip(config: PoolConfig) -> None:
    buffer, geometry = _segment(config)
    read_config, read_geometry = read_header(buffer, geometry.total_bytes, "test")
    assert read_config == config
    assert read_geometry == geometry
    header = np.ndarray((), HEADER_DTYPE, buffer=buffer)
    assert header["magic"].item() == MAGIC
    # only a pool with inline slots (13) or request counts (12, prefix) needs that format
    newest = 13 if config.inline_bytes else 12 if config.policy == "prefix" else 10
    assert int(header["format_version"]) == newest
    assert float(header["created_at"]) == 1234.5
    assert int(header["free_page_head"]) == NO_PAGE
    assert float(header["next_expiry_at"]) == math.inf
    assert int(header["dirty"]) == 0 and int(header["num_live"]) == 0


@settings(max_examples=60, deadline=None)
@given(
    num_pages=st.integers(1, 3000),
    page_shift=st.integers(10, 16),
    max_entries=st.one_of(st.just(None), st.integers(1, 5000)),
    policy=st.sampled_from(sorted(POLICIES)),
    ttl=st.one_of(st.none(), st.floats(0.001, 1e9)),
    samples=st.integers(1, 1 << 16),
    half_life=st.one_of(st.none(), st.integers(1, 2**40)),
    procs=st.integers(1, 4096),
    inline_bytes=st.sampled_from([0, 48, 64, 128, 512]),
)
def test_header_round_trip_any_config(
    num_pages: int,
    page_shift: int,
    max_entries: int | None,
    policy: str,
    ttl: float | None,
    samples: int,
    half_life: int | None,
    procs: int,
    inline_bytes: int,
) -> None:
    most_entries = 5000 if inline_bytes else num_pages
    config = PoolConfig.build(
        num_pages << page_shift,
        page_size=1 << page_shift,
        max_entries=None if max_entries is None else min(max_entries, most_entries),
        inline_bytes=inline_bytes,
        policy=policy,
        default_ttl=ttl,
        eviction_samples=samples,
        lfu_half_life=half_life,
        max_processes=procs,
    )
    buffer, geometry = _segment(config)
    assert read_header(buffer, geometry.total_bytes, "test") == (config, geometry)
    _check_regions(geometry)


def _regions(g: Geometry) -> list[tuple[str, int, int]]:
    return [
        ("header", 0, HEADER_BYTES),
        ("procs", g.procs_offset, g.max_processes * PROC_DTYPE.itemsize),
        ("entries", g.entries_offset, g.max_entries * ENTRY_DTYPE.itemsize),
        ("live", g.live_offset, g.max_entries * 8),
        ("index", g.index_offset, g.index_slots * 8),
        ("page_next", g.page_next_offset, g.num_pages * 8),
        ("data", g.data_offset, g.num_pages * g.page_size_bytes),
        *([("inline", g.inline_offset, g.max_entries * g.inline_bytes)] if g.inline_bytes else []),
        *([("sketch", g.sketch_offset, g.sketch_bytes)] if g.sketch_bytes else []),
    ]


def _check_regions(g: Geometry) -> None:
    regions = _regions(g)
    for name, offset, length in regions:
        assert offset % ALIGN_BYTES == 0, name
        assert length > 0, name
    for (name, offset, length), (next_name, next_offset, _) in itertools.pairwise(regions):
        assert offset + length <= next_offset, f"{name} overlaps {next_name}"
    _, last_offset, last_length = regions[-1]
    assert last_offset + last_length == g.total_bytes
    assert (g.inline_offset == 0) == (g.inline_bytes == 0)
    assert (g.sketch_offset == 0) == (g.sketch_bytes == 0)
    assert g.sketch_bytes & (g.sketch_bytes - 1) == 0
    assert g.metadata_bytes == g.data_offset
    # the index keeps a load factor of at most 1/2 and is a power of two
    assert g.index_slots >= 2 * g.max_entries
    assert g.index_slots & (g.index_slots - 1) == 0


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.policy}-{c.num_pages}p")
def test_regions_do_not_overlap_and_are_aligned(config: PoolConfig) -> None:
    _check_regions(Geometry.for_config(config))


def test_index_slots_are_the_next_power_of_two_of_twice_the_entries() -> None:
    def slots(max_entries: int) -> int:
        config = PoolConfig.build("1M", page_size="1K", max_entries=max_entries)
        return Geometry.for_config(config).index_slots

    assert slots(1) == 2
    assert slots(2) == 4
    assert slots(16) == 32
    assert slots(17) == 64


@pytest.mark.parametrize("size", ["1G", "16G"])
def test_metadata_overhead_below_one_percent_at_default_page_size(size: str) -> None:
    config = PoolConfig.build(size)
    assert Geometry.for_config(config).metadata_bytes / config.size_bytes < 0.01


def test_entry_record_is_256_bytes_of_8_byte_words() -> None:
    assert ENTRY_DTYPE.itemsize == 256
    assert ENTRY_WORDS == 32
    for name, (dtype, offset) in ENTRY_DTYPE.fields.items():
        assert dtype.itemsize == 8, name
        assert offset % 8 == 0, name


def test_header_fits_its_page_and_fields_are_word_aligned() -> None:
    assert HEADER_DTYPE.itemsize <= HEADER_BYTES
    for name, (dtype, offset) in HEADER_DTYPE.fields.items():
        assert offset % 8 == 0, name
        assert dtype.itemsize % 8 == 0, name


def test_word_indexes_match_dtype_offsets() -> None:
    for name, (_, offset) in HEADER_DTYPE.fields.items():
        assert getattr(H, name) * 8 == offset, name
    for name, (_, offset) in ENTRY_DTYPE.fields.items():
        assert getattr(E, name) * 8 == offset, name
    assert E.generation == 0 and H.magic == 0


def test_views_alias_the_same_bytes() -> None:
    buffer, geometry = _segment(CONFIGS[1])
    views = Views(buffer, geometry)
    try:
        views.header_q[H.clock] = 41
        assert int(views.header["clock"]) == 41
        views.header_d[H.next_expiry_at] = 2.5
        assert float(views.header["next_expiry_at"]) == 2.5
        eid = geometry.max_entries - 1
        views.entries_q[eid * ENTRY_WORDS + E.hash_lo] = -7
        views.entries_d[eid * ENTRY_WORDS + E.expires_at] = 9.75
        assert int(views.entries[eid]["hash_lo"]) == -7
        assert float(views.entries[eid]["expires_at"]) == 9.75
        views.index_q[geometry.index_slots - 1] = 5
        assert int(views.index[-1]) == 5
        views.page_next_q[geometry.num_pages - 1] = 3
        assert int(views.page_next[-1]) == 3
        views.live_q[0] = 8
        assert int(views.live[0]) == 8
        views.procs[0] = (11, 12, 13, 14)
        assert tuple(views.procs[0]) == (11, 12, 13, 14)
        views.data[-1] = 0xAB
        assert buffer[geometry.total_bytes - 1] == 0xAB
        offset = geometry.page_next_offset + 8 * (geometry.num_pages - 1)
        assert int.from_bytes(buffer[offset : offset + 8], "little") == 3
    finally:
        views.release()
    buffer.close()  # possible only once every view is released


def test_read_header_rejects_a_file_of_another_size() -> None:
    buffer, geometry = _segment(CONFIGS[0])
    for file_bytes in (geometry.total_bytes - 4096, geometry.total_bytes + 4096):
        with pytest.raises(IncompatiblePoolError, match="geometry"):
            read_header(buffer, file_bytes, "test")
    with pytest.raises(IncompatiblePoolError, match="too small"):
        read_header(buffer, HEADER_BYTES - 1, "test")


def test_read_header_rejects_no_magic_and_other_versions() -> None:
    buffer, geometry = _segment(CONFIGS[0])
    header = np.ndarray((), HEADER_DTYPE, buffer=buffer)
    header["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(IncompatiblePoolError, match="version"):
        read_header(buffer, geometry.total_bytes, "test")
    header["format_version"] = FORMAT_VERSION
    header["magic"] = b"KVCACHE0"
    with pytest.raises(IncompatiblePoolError, match="not a kvcache pool"):
        read_header(buffer, geometry.total_bytes, "test")


GEOMETRY_WORDS = [
    "total_bytes",
    "page_size_bytes",
    "num_pages",
    "max_entries",
    "index_slots",
    "max_processes",
    "procs_offset",
    "entries_offset",
    "live_offset",
    "index_offset",
    "page_next_offset",
    "data_offset",
]


@pytest.mark.parametrize("field", GEOMETRY_WORDS)
@pytest.mark.parametrize("delta", [1, -1, 4096, 1 << 40, -(1 << 62)])
def test_read_header_rejects_any_changed_geometry_word(field: str, delta: int) -> None:
    # Counts (max_entries, max_processes) are only checked through the layout they
    # imply: one fewer can fit the same 4 KiB-aligned regions, so -1 may pass unseen.
    if delta == -1 and field in ("max_entries", "max_processes"):
        delta = -4096
    buffer, geometry = _segment(CONFIGS[1])
    header = np.ndarray((), HEADER_DTYPE, buffer=buffer)
    header[field] = int(header[field]) + delta
    with pytest.raises(IncompatiblePoolError, match="damaged header"):
        read_header(buffer, geometry.total_bytes, "test")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("policy", b"mru"),
        ("policy", b"\xff\xfe"),
        ("policy", b""),
        ("eviction_samples", 0),
        ("lfu_half_life", -3),
        ("default_ttl_s", math.inf),
        ("max_processes", 0),
    ],
)
def test_read_header_rejects_damaged_configuration(field: str, value: object) -> None:
    buffer, geometry = _segment(CONFIGS[1])
    np.ndarray((), HEADER_DTYPE, buffer=buffer)[field] = value
    with pytest.raises(IncompatiblePoolError, match="damaged header"):
        read_header(buffer, geometry.total_bytes, "test")


VALIDATED_WORDS = [
    "format_version",
    *GEOMETRY_WORDS,
    "default_ttl_s",
    "eviction_samples",
    "lfu_half_life",
]


@settings(max_examples=100, deadline=None)
@given(
    changes=st.lists(
        st.tuples(
            st.sampled_from([*VALIDATED_WORDS, "policy", "policy+8"]),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_read_header_never_trusts_random_words(changes: list[tuple[str, int]]) -> None:
    """Whatever is written over the validated words, read_header either refuses with
    IncompatiblePoolError or returns a geometry that fits the file exactly."""
    buffer, geometry = _segment(CONFIGS[3])
    words = memoryview(buffer)[:HEADER_BYTES].cast("q")
    for field, value in changes:
        offset = HEADER_DTYPE.fields[field.removesuffix("+8")][1]
        words[offset // 8 + field.endswith("+8")] = value
    words.release()
    try:
        config, read = read_header(buffer, geometry.total_bytes, "test")
    except IncompatiblePoolError:
        return
    assert read.total_bytes == geometry.total_bytes
    _check_regions(read)
    assert read == Geometry.for_config(config)
