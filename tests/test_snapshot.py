"""Persist and restore, on real /dev/shm pools and real snapshot files.

Covers: exact round trips under every policy (values, keys, priorities,
expiries, the policy metadata and the logical clock, hence the eviction
order), the configuration, expiry while down, restoring into smaller or
larger pools, default locations and permissions, replacing pools, and the
durability promises (a process killed mid-persist, a full disk).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument, PoolExistsError, SnapshotError, builds
from kvcache.layout import H
from kvcache.policies import POLICIES
from kvcache.snapshot import format as snapshot_format
from kvcache.snapshot.format import FORMAT_VERSION, HEADER_BYTES, HEADER_DTYPE

SHM = Path(os.environ.get("KVCACHE_SHM_DIR", "/dev/shm"))
FIELDS = (
    "created",
    "last_access",
    "freq",
    "priority",
    "expires_at",
    "flags",
    "key_len",
    "header_len",
    "value_len",
    "num_pages",
)
"""Entry-table fields a restore must reproduce exactly."""


# ----------------------------------------------------------------- helpers


class Pools:
    """Extra pool names and handles of one test; all closed and destroyed afterwards."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.handles: list[kvcache.Pool] = []

    def name(self) -> str:
        name = f"test-snap-{uuid.uuid4().hex[:12]}"
        self.names.append(name)
        return name

    def keep(self, pool: kvcache.Pool) -> kvcache.Pool:
        self.handles.append(pool)
        return pool

    def cleanup(self) -> None:
        for pool in self.handles:
            pool.close()
        for name in self.names:
            if name in kvcache.list_pools():
                kvcache.destroy(name)


@pytest.fixture
def pools() -> Iterator[Pools]:
    extra = Pools()
    yield extra
    extra.cleanup()


def hidden_segments(name: str) -> list[str]:
    """Temporary segments (``.kvcache.<name>.<hex>``) left in the shared-memory folder."""
    return [f for f in os.listdir(SHM) if f.startswith(f".kvcache.{name}.")]


def key_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def entry_fields(pool: kvcache.Pool) -> dict[bytes, tuple[object, ...]]:
    """Key -> the entry-table fields of its entry, found through the key index."""
    out: dict[bytes, tuple[object, ...]] = {}
    with pool._engine.lock:
        for eid in pool._engine.table.entries.live_ids().tolist():
            key = bytes(pool._engine.table.key_view(eid))
            assert pool._engine.table.find(key) == eid  # the index leads to this very entry
            record = pool._engine.views.entries[eid]
            out[key] = tuple(record[f].item() for f in FIELDS)
    return out


def victim_order(pool: kvcache.Pool) -> list[bytes]:
    """Every live key, the policy's first victim first (as ``Pool.evict`` ranks them)."""
    with pool._engine.lock:
        return [
            bytes(pool._engine.table.key_view(eid)) for eid, _ in pool._engine.evictor.rank_all()
        ]


def logical_clock(pool: kvcache.Pool) -> int:
    with pool._engine.lock:
        return int(pool._engine.views.header_q[H.clock])


def assert_same_value(got: object, expected: object) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        assert got.tobytes() == expected.tobytes()
    else:
        assert type(got) is bytes
        assert got == bytes(expected)  # type: ignore[call-overload]


def varied_values(rng: np.random.Generator) -> dict[str | bytes, object]:
    """Values from 0 bytes to multi-page, bytes and arrays, str and bytes keys."""
    values: dict[str | bytes, object] = {}
    for size in (0, 1, 100, 1023, 1024, 1025, 3 * 4096 + 17, 65_536, 65_537, 300_000):
        values[f"bytes-{size}"] = rng.bytes(size)
    values["ключ-🔑"] = rng.bytes(5000)
    values[b"\xff\x00\x80raw-key"] = rng.bytes(2048)
    values[b"b"] = b"x"
    values["k" * 1024] = rng.bytes(700)  # the longest key there is
    values["f16"] = rng.standard_normal((2, 3, 4)).astype(np.float16)
    values["i64"] = rng.integers(-(2**62), 2**62, 1000, dtype=np.int64)
    values["f32-256K"] = rng.standard_normal((64, 1024)).astype(np.float32)
    values[b"bool"] = rng.random(7) < 0.5
    values["c64"] = (rng.standard_normal((3, 3)) + 1j).astype(np.complex64)
    values["empty-array"] = np.zeros((0, 5), np.float32)
    values["scalar"] = np.array(3.5)
    return values


def fill_varied(pool: kvcache.Pool, rng: np.random.Generator) -> dict[str | bytes, object]:
    """Store ``varied_values`` with mixed priorities, expiries and accesses; return them."""
    values = varied_values(rng)
    for i, (key, value) in enumerate(values.items()):
        priority = (2**61, -(2**61), 0)[i] if i < 3 else int(rng.integers(-50, 50))
        ttl = None if i % 3 == 0 else 3600.0 * (i + 1)  # distinct expiries, some never
        pool.put(key, value, priority=priority, ttl=ttl)
    keys = list(values)
    for _ in range(80):  # recency and frequency differ from insertion order
        assert pool.get(keys[int(rng.integers(len(keys)))]) is not None
    pool.put("replaced", b"old")
    pool.put("replaced", b"new", priority=7)
    values["replaced"] = b"new"
    pool.put("deleted", b"gone")
    pool.delete("deleted")
    return values


# --------------------------------------------------------------- round trips


SCORED = sorted(name for name, policy in POLICIES.items() if not policy.uses_queues)
"""Policies whose whole state is the entries' history, which a snapshot keeps. The queues
of s3fifo and arc (their order, S3-FIFO's read counts, the ghosts) are not in a snapshot:
a restore requeues entries by their history (docs/eviction.md)."""


@pytest.mark.parametrize("page_size", ["1K", "4K"])
@pytest.mark.parametrize("policy", SCORED)
def test_round_trip_restores_values_metadata_and_eviction_order(
    make_pool, pools, clock, tmp_path, policy, page_size
):
    original = make_pool("8M", page_size=page_size, policy=policy, clock=clock)
    values = fill_varied(original, np.random.default_rng(len(policy)))
    path = kvcache.persist(original, tmp_path / "pool.kvsnap")
    name = pools.name()

    restored, report = kvcache.restore_with_report(name, path, clock=clock)
    pools.keep(restored)

    assert report.num_restored == len(values)
    assert (report.num_expired, report.num_dropped, report.skipped) == (0, 0, [])
    assert restored.name == name
    assert restored.config == original.config
    assert sorted(map(repr, restored.keys())) == sorted(map(repr, original.keys()))
    assert entry_fields(restored) == entry_fields(original)
    assert logical_clock(restored) == logical_clock(original)
    assert victim_order(restored) == victim_order(original)
    assert restored.check() == []
    assert hidden_segments(name) == []

    for key, value in values.items():  # same reads on both: they stay in step
        assert_same_value(restored.get(key), value)
        assert_same_value(original.get(key), value)
    assert entry_fields(restored) == entry_fields(original)

    # the next eviction takes the same key from both
    before = set(original.keys())
    assert restored.evict(bytes=1).num_entries == original.evict(bytes=1).num_entries == 1
    gone = before - set(original.keys())
    assert len(gone) == 1
    assert before - set(restored.keys()) == gone


@pytest.mark.parametrize("policy", [name for name in POLICIES if POLICIES[name].uses_queues])
def test_a_restored_queue_policy_pool_requeues_its_entries(
    make_pool, pools, clock, tmp_path, policy
):
    """Entries never read since their put go back on probation, the others to main."""
    original = make_pool("24K", page_size="1K", policy=policy, clock=clock)
    for i in range(20):
        original.put(f"k{i}", b"v" * 600)
    for i in range(0, 20, 3):
        original.get(f"k{i}")
    path = kvcache.persist(original, tmp_path / "q.kvsnap")
    restored = pools.keep(kvcache.restore_with_report(pools.name(), path, clock=clock)[0])
    assert sorted(map(repr, restored.keys())) == sorted(map(repr, original.keys()))
    assert restored.check() == []
    records = restored._engine.views.entries[restored._engine.table.entries.live_ids()]
    never_read = records["created"] == records["last_access"]
    assert (records["probation"] == never_read).all()
    for i in range(20, 40):  # and it goes on evicting by its queues
        restored.put(f"k{i}", b"v" * 600)
    assert restored.check() == [] and restored.stats().evictions > 0


@pytest.mark.parametrize("policy", SCORED)
def test_restored_pool_evicts_like_the_original_from_then_on(
    make_pool, pools, clock, tmp_path, policy
):
    """Identical traffic after the restore makes identical eviction decisions."""
    original = make_pool("24K", page_size="1K", policy=policy, clock=clock, lfu_half_life=8)
    rng = np.random.default_rng(11)
    for i in range(14):
        original.put(
            f"k{i}",
            rng.bytes(int(rng.integers(1, 2800))),
            priority=int(rng.integers(0, 5)),
            ttl=None if i % 4 == 0 else 1000.0 + i,
        )
    for _ in range(40):
        original.get(f"k{int(rng.integers(14))}")
    for _ in range(25):  # ticks the logical clock without leaving entries behind
        original.put("transient", b"t")
        original.delete("transient")
    path = kvcache.persist(original, tmp_path / "s.kvsnap")
    restored = pools.keep(kvcache.restore_with_report(pools.name(), path, clock=clock)[0])

    for step in range(120):
        op = rng.random()
        if op < 0.45:
            key = f"k{int(rng.integers(30))}"
            assert_equal_reads(original.get(key), restored.get(key))
        elif op < 0.9:
            key, size = f"k{int(rng.integers(30))}", int(rng.integers(1, 2800))
            value, priority = rng.bytes(size), int(rng.integers(0, 5))
            ttl = None if rng.random() < 0.3 else 2000.0 + step
            original.put(key, value, priority=priority, ttl=ttl)
            restored.put(key, value, priority=priority, ttl=ttl)
        else:
            key = f"k{int(rng.integers(30))}"
            assert original.delete(key) == restored.delete(key)
        assert sorted(original.keys()) == sorted(restored.keys()), f"diverged at step {step}"
    assert entry_fields(restored) == entry_fields(original)
    assert original.stats().evictions > 10  # the traffic really did evict


def assert_equal_reads(a: object, b: object) -> None:
    if a is None:
        assert b is None
    else:
        assert_same_value(b, a)


def test_bug_logical_clock_not_restored_changed_lfu_evictions(make_pool, pools, tmp_path):
    """Regression: restore left the logical clock at (about) the newest entry's last access.

    LFU ages counts against the clock, so with a smaller clock a new entry
    weighed far less against an old hot one than in the original pool, and
    the first eviction after the restore removed a different key.
    """
    original = make_pool("4K", page_size="1K", policy="lfu", lfu_half_life=4)
    original.put("hot", b"h" * 100)
    for _ in range(20):
        original.get("hot")
    for _ in range(40):
        original.put("transient", b"t")
        original.delete("transient")
    path = kvcache.persist(original, tmp_path / "s.kvsnap")
    restored = pools.keep(kvcache.restore(pools.name(), path))
    assert logical_clock(restored) == logical_clock(original) == 61
    for key in "BCDE":  # the fourth put evicts one entry
        original.put(key, b"y" * 900)
        restored.put(key, b"y" * 900)
    assert sorted(original.keys()) == ["B", "C", "D", "E"]
    assert sorted(restored.keys()) == ["B", "C", "D", "E"]


def test_empty_pool_round_trips(make_pool, pools, tmp_path):
    original = make_pool("1M", page_size="4K", policy="fifo")
    path = kvcache.persist(original, tmp_path / "empty.kvsnap")
    info = kvcache.inspect_snapshot(path)
    assert (info.num_entries, info.data_bytes) == (0, 0)
    restored, report = kvcache.restore_with_report(pools.name(), path)
    pools.keep(restored)
    assert (len(restored), report.num_restored) == (0, 0)
    assert restored.config == original.config
    restored.put("after", b"works")
    assert restored.get("after") == b"works"


def test_config_survives_and_inspect_reports_it(make_pool, pools, clock, tmp_path):
    original = make_pool(
        "2M",
        page_size="4K",
        policy="lfu",
        max_entries=100,
        default_ttl="1h",
        eviction_samples=16,
        lfu_half_life=77,
        clock=clock,
    )
    original.put("a", b"1" * 10)
    original.put(b"b", np.arange(10, dtype=np.int32))
    before = time.time()
    path = kvcache.persist(original, tmp_path / "cfg.kvsnap")

    info = kvcache.inspect_snapshot(path)
    assert info.name == original.name
    assert info.config == original.config
    assert info.config.policy == "lfu"
    assert (info.config.page_size_bytes, info.config.max_entries) == (4096, 100)
    assert (info.config.default_ttl_s, info.config.eviction_samples) == (3600.0, 16)
    assert info.config.lfu_half_life == 77
    assert info.num_entries == 2
    assert info.data_bytes == 1 + 10 + 1 + (2 + 3 + 8) + 40  # keys, array header, payloads
    assert info.file_bytes == path.stat().st_size
    assert before - 1 <= info.created_at <= time.time() + 1
    assert info.format_version == FORMAT_VERSION == 2
    assert info.to_dict()["config"] == original.config.to_dict()

    restored = pools.keep(kvcache.restore_with_report(pools.name(), path, clock=clock)[0])
    assert restored.config == original.config
    restored.put("new", b"n")  # the default ttl applies to new puts too
    clock.advance(3599)
    assert restored.get("new") == b"n"
    clock.advance(2)
    assert restored.get("new") is None
    assert restored.get("a") is None  # put earlier, with the same default ttl


def _snapshot_v1_module() -> ModuleType:
    path = Path(__file__).parent / "data" / "make_snapshot_v1.py"
    spec = importlib.util.spec_from_file_location("make_snapshot_v1", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_version_1_snapshot_of_the_previous_release_restores(pools, tmp_path):
    """Version 1 summed an entry's bytes only: its files are verified by that sum, and
    the restored pool keeps today's sums (which also cover the read fields)."""
    made = _snapshot_v1_module()
    v1 = Path(made.__file__).with_name("snapshot-v1.kvsnap")  # written by 515ebf2
    assert kvcache.inspect_snapshot(v1).format_version == 1
    restored, report = kvcache.restore_with_report(pools.name(), v1)
    pools.keep(restored)
    assert (report.num_restored, report.skipped) == (len(made.VALUES), [])
    for key, value in made.VALUES.items():
        got = restored.get(key)
        assert type(got) is type(value) and np.array_equal(got, value), key  # type: ignore[arg-type]
    entries = {e.key: e for e in restored.entries()}
    assert {key: entries[key].priority for key in made.PRIORITIES} == made.PRIORITIES
    assert entries["array"].frequency > 1  # its hits before the snapshot
    assert restored.check() == []  # the sums were converted, not copied
    again = kvcache.inspect_snapshot(kvcache.persist(restored, tmp_path / "again.kvsnap"))
    assert again.format_version == FORMAT_VERSION == 2


def test_a_damaged_entry_of_a_version_1_snapshot_is_skipped(pools, tmp_path):
    raw = bytearray((Path(__file__).parent / "data" / "snapshot-v1.kvsnap").read_bytes())
    raw[HEADER_BYTES + 5] ^= 0x01  # in the first entry's bytes: the header sum still holds
    damaged = tmp_path / "damaged-v1.kvsnap"
    damaged.write_bytes(bytes(raw))
    restored, report = kvcache.restore_with_report(pools.name(), damaged)
    pools.keep(restored)
    assert len(report.skipped) == 1 and "checksum" in report.skipped[0]
    assert report.num_restored == len(_snapshot_v1_module().VALUES) - 1
    assert restored.check() == []


def test_entries_that_expired_while_down_are_not_restored(make_pool, pools, clock, tmp_path):
    original = make_pool("1M", page_size="1K", policy="ttl", clock=clock)
    original.put("gone-at-persist", b"0", ttl=5)
    original.put("short", b"1", ttl=100)
    original.put("shorter", b"2", ttl=50)
    original.put("long", b"3", ttl=10_000)
    original.put("forever", b"4")
    clock.advance(10)  # the first one expires before the snapshot is taken
    path = kvcache.persist(original, tmp_path / "ttl.kvsnap")
    assert kvcache.inspect_snapshot(path).num_entries == 4
    expected_long = entry_fields(original)[b"long"]

    clock.advance(200)  # the pool is down for 200 s
    restored, report = kvcache.restore_with_report(pools.name(), path, clock=clock)
    pools.keep(restored)
    assert sorted(restored.keys()) == ["forever", "long"]
    assert (report.num_restored, report.num_expired, report.num_dropped) == (2, 2, 0)
    assert entry_fields(restored)[b"long"] == expected_long  # expiry kept, not refreshed
    clock.advance(10_000 - 210)
    assert restored.get("long") is None
    assert restored.get("forever") == b"4"


# ------------------------------------------------------------ other sizes


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_smaller_pool_keeps_the_entries_the_policy_ranks_last(
    make_pool, pools, clock, tmp_path, policy
):
    original = make_pool("32K", page_size="1K", policy=policy, clock=clock, lfu_half_life=16)
    rng = np.random.default_rng(5)
    values = {}
    for i in range(32):
        values[f"k{i}"] = rng.bytes(int(rng.integers(1, 1000)))  # one page each
        original.put(
            f"k{i}", values[f"k{i}"], priority=int(rng.integers(0, 100)), ttl=1000.0 + 7 * i
        )
    for _ in range(60):
        original.get(f"k{int(rng.integers(32))}")
    ranking = victim_order(original)
    fields = entry_fields(original)
    path = kvcache.persist(original, tmp_path / "s.kvsnap")

    restored, report = kvcache.restore_with_report(pools.name(), path, size="12K", clock=clock)
    pools.keep(restored)
    kept = {key_bytes(k) for k in restored}
    assert kept == set(ranking[-12:])
    assert (report.num_restored, report.num_dropped, report.num_expired) == (12, 20, 0)
    assert report.skipped == []
    assert restored.config.size_bytes == 12 * 1024
    assert restored.config.max_entries == 12  # per-page default follows the size
    assert restored.config.policy == policy
    assert victim_order(restored) == ranking[-12:]
    assert entry_fields(restored) == {k: fields[k] for k in kept}
    for key in kept:
        assert restored.get(key) == values[key.decode()]
    assert restored.check() == []


def test_smaller_pool_lru_keeps_the_most_recently_used(make_pool, pools, tmp_path):
    original = make_pool("16K", page_size="1K", policy="lru")
    for i in range(16):
        original.put(f"k{i}", bytes([i]) * 500)
    touched = [3, 14, 0, 9, 7, 1]  # the most recently used, newest last
    for i in touched:
        original.get(f"k{i}")
    path = kvcache.persist(original, tmp_path / "lru.kvsnap")
    restored, report = kvcache.restore_with_report(pools.name(), path, size="4K")
    pools.keep(restored)
    assert sorted(restored.keys()) == sorted(f"k{i}" for i in touched[-4:])
    assert report.num_dropped == 12
    # and the survivors keep their order: the oldest of them goes first
    restored.put("new", b"n" * 500)
    assert sorted(restored.keys()) == sorted(["k9", "k7", "k1", "new"])


def test_smaller_pool_priority_keeps_the_highest_priorities(make_pool, pools, tmp_path):
    original = make_pool("16K", page_size="1K", policy="priority")
    priorities = [5, 90, -3, 42, 17, 88, 0, 61, 33, 7, 99, 12, 70, 2, 55, 1]
    for priority in priorities:
        original.put(f"p{priority}", b"v" * 700, priority=priority)
    path = kvcache.persist(original, tmp_path / "prio.kvsnap")
    restored, report = kvcache.restore_with_report(pools.name(), path, size="5K")
    pools.keep(restored)
    assert sorted(restored.keys()) == sorted(f"p{p}" for p in sorted(priorities)[-5:])
    assert (report.num_restored, report.num_dropped) == (5, 11)


def test_smaller_pool_size_policy_keeps_small_entries_and_counts_expired_apart(
    make_pool, pools, clock, tmp_path
):
    original = make_pool("64K", page_size="1K", policy="size", clock=clock)
    for pages in range(1, 9):  # entries of 1..8 pages: 36 pages
        original.put(f"p{pages}", b"s" * (pages * 1024 - 10))
    original.put("expiring", b"e", ttl=30)
    path = kvcache.persist(original, tmp_path / "size.kvsnap")
    clock.advance(60)
    restored, report = kvcache.restore_with_report(pools.name(), path, size="10K", clock=clock)
    pools.keep(restored)
    assert sorted(restored.keys()) == ["p1", "p2", "p3", "p4"]  # 10 pages
    assert (report.num_restored, report.num_dropped, report.num_expired) == (4, 4, 1)


def test_larger_pool_restores_everything_and_has_room(make_pool, pools, tmp_path):
    original = make_pool("16K", page_size="1K", policy="lru", max_entries=12)
    for i in range(10):
        original.put(f"k{i}", bytes([i]) * 1000)
    path = kvcache.persist(original, tmp_path / "grow.kvsnap")
    restored, report = kvcache.restore_with_report(pools.name(), path, size="64K")
    pools.keep(restored)
    assert (report.num_restored, report.num_dropped) == (10, 0)
    assert restored.config.size_bytes == 64 * 1024
    assert restored.config.max_entries == 12  # set explicitly: kept, not scaled
    assert restored.config.page_size_bytes == 1024
    for i in range(10):
        assert restored.get(f"k{i}") == bytes([i]) * 1000
    for i in range(2):
        restored.put(f"big{i}", b"b" * 15_000)  # 15 pages each: fits without evicting
    assert restored.stats().evictions == 0
    assert len(restored) == 12
    restored.put("one-more", b"m")  # the 13th entry: max_entries makes room
    assert restored.stats().evictions == 1
    assert "k0" not in restored  # the least recently used


# ------------------------------------------------------- files and names


def test_default_path_honours_kvcache_home_with_private_modes(
    make_pool, pools, tmp_path, monkeypatch
):
    home = tmp_path / "state" / "kvcache-home"
    monkeypatch.setenv("KVCACHE_HOME", str(home))
    pool = make_pool("1M", page_size="4K")
    pool.put("a", b"alpha")
    path = kvcache.persist(pool)
    assert path == home / f"{pool.name}.kvsnap"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert sorted(os.listdir(home)) == [path.name]  # no temporary file left behind

    name = pool.name
    pool.close()
    kvcache.destroy(name)
    restored = pools.keep(kvcache.restore(name))  # from the default path
    assert restored.get("a") == b"alpha"


def test_default_path_without_kvcache_home(make_pool, tmp_path, monkeypatch):
    pool = make_pool("1M", page_size="4K")
    pool.put("a", b"1")
    monkeypatch.delenv("KVCACHE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert kvcache.persist(pool) == tmp_path / "xdg" / "kvcache" / f"{pool.name}.kvsnap"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".local" / "share" / "kvcache" / f"{pool.name}.kvsnap"
    assert kvcache.persist(pool) == expected
    assert expected.is_file()


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_snapshot_is_0600_and_folder_0700_whatever_the_umask(make_pool, tmp_path, umask):
    pool = make_pool("1M", page_size="4K")
    pool.put("a", b"1")
    folder = tmp_path / "snaps"
    old = os.umask(umask)
    try:
        path = kvcache.persist(pool, folder / "p.kvsnap")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        os.chmod(path, 0o644)  # a previous snapshot someone loosened ...
        kvcache.persist(pool, path)  # ... is replaced by a private one
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_persist_replaces_the_previous_snapshot_whole(make_pool, pools, tmp_path):
    pool = make_pool("1M", page_size="1K")
    pool.put("first", b"1" * 3000)
    path = kvcache.persist(pool, tmp_path / "p.kvsnap")
    pool.delete("first")
    pool.put("second", b"2" * 10)
    assert kvcache.persist(pool, path) == path
    assert sorted(os.listdir(tmp_path)) == ["p.kvsnap"]
    restored = pools.keep(kvcache.restore(pools.name(), path))
    assert restored.keys() == ["second"]


def test_restore_onto_existing_pool_without_replace_raises_and_leaves_it(
    make_pool, pools, tmp_path
):
    source = pools.keep(kvcache.create(pools.name(), "1M", page_size="4K"))
    source.put("from-snapshot", b"s")
    path = kvcache.persist(source, tmp_path / "s.kvsnap")
    live = make_pool("1M", page_size="1K", policy="fifo")
    live.put("live", b"L" * 5000)
    inode = (SHM / f"kvcache.{live.name}").stat().st_ino

    with pytest.raises(PoolExistsError, match="replace=True") as info:
        kvcache.restore(live.name, path)
    assert "--replace" not in str(info.value)  # a Python caller has no such flag
    with pytest.raises(PoolExistsError):
        kvcache.restore_with_report(live.name, path, replace=False)

    assert (SHM / f"kvcache.{live.name}").stat().st_ino == inode
    assert live.keys() == ["live"]
    assert live.get("live") == b"L" * 5000
    with kvcache.open(live.name) as again:
        assert again.config.policy == "fifo"
        assert again.get("live") == b"L" * 5000
    assert hidden_segments(live.name) == []


def test_restore_with_replace_swaps_the_pool_and_old_handles_are_told(make_pool, pools, tmp_path):
    """Old handles used to go on using the replaced file (their puts vanished);
    now their next call fails and says to open the pool again."""
    source = pools.keep(kvcache.create(pools.name(), "1M", page_size="4K", policy="lfu"))
    source.put("from-snapshot", b"s" * 100)
    path = kvcache.persist(source, tmp_path / "s.kvsnap")
    live = make_pool("1M", page_size="1K")
    live.put("live", b"L")

    restored = pools.keep(kvcache.restore(live.name, path, replace=True))
    assert restored.name == live.name
    assert restored.keys() == ["from-snapshot"]
    assert restored.config.policy == "lfu"
    with pytest.raises(kvcache.PoolDestroyedError, match=r"replaced by a restore.*open"):
        live.get("live")
    with kvcache.open(live.name) as fresh:
        assert fresh.keys() == ["from-snapshot"]
    assert hidden_segments(live.name) == []


def mode_of(name: str) -> int:
    return stat.S_IMODE((SHM / f"kvcache.{name}").stat().st_mode)


def test_bug_restore_lost_a_group_shared_pools_mode(make_pool, pools, tmp_path):
    """A 0660 pool came back 0600, locking its group out; the snapshot keeps the mode now."""
    original = make_pool("1M", mode=0o660)
    original.put("k", b"v")
    path = kvcache.persist(original, tmp_path / "group.kvsnap")
    assert kvcache.inspect_snapshot(path).mode == 0o660
    assert kvcache.inspect_snapshot(path).to_dict()["mode"] == "660"

    same = pools.name()
    pools.keep(kvcache.restore(same, path))
    assert mode_of(same) == 0o660
    private = pools.name()
    pools.keep(kvcache.restore(private, path, mode=0o600))
    assert mode_of(private) == 0o600


def test_snapshot_without_a_recorded_mode_restores_0600(make_pool, pools, tmp_path):
    """Snapshots of older writers have zero where the mode now is (and still verify)."""
    original = make_pool("1M", mode=0o660)
    original.put("k", b"v")
    path = kvcache.persist(original, tmp_path / "old.kvsnap")
    raw = bytearray(path.read_bytes())
    header = np.frombuffer(bytes(raw[: HEADER_DTYPE.itemsize]), HEADER_DTYPE)[0]
    for field in ("mode", "checksum"):
        offset = HEADER_DTYPE.fields[field][1]  # type: ignore[index]
        raw[offset : offset + 8] = bytes(8)
    records = bytes(raw[int(header["records_offset"]) :])
    checksum = snapshot_format._checksum(bytes(raw[:HEADER_BYTES]), records)
    offset = HEADER_DTYPE.fields["checksum"][1]  # type: ignore[index]
    raw[offset : offset + 8] = checksum.to_bytes(8, "little")
    path.write_bytes(raw)

    assert kvcache.inspect_snapshot(path).mode == 0o600
    name = pools.name()
    restored = pools.keep(kvcache.restore(name, path))
    assert (mode_of(name), restored.get("k")) == (0o600, b"v")


@pytest.mark.parametrize("mode", [0o777, 0o755, 0o700, 0o060])
def test_restore_refuses_unsafe_modes_even_with_force(make_pool, pools, tmp_path, mode):
    original = make_pool("1M")
    original.put("k", b"v")
    path = kvcache.persist(original, tmp_path / "s.kvsnap")
    name = pools.name()
    with pytest.raises(InvalidArgument, match="mode"):
        kvcache.restore(name, path, mode=mode, force=True)
    assert name not in kvcache.list_pools() and hidden_segments(name) == []


def test_restore_gives_other_users_access_only_with_force(make_pool, pools, tmp_path):
    original = make_pool("1M", mode=0o666, force=True)
    original.put("k", b"v")
    path = kvcache.persist(original, tmp_path / "open.kvsnap")
    name = pools.name()
    for mode in (None, 0o644):  # the snapshot's 0666 needs the restorer's consent too
        with pytest.raises(InvalidArgument, match="force"):
            kvcache.restore(name, path, mode=mode)
    assert name not in kvcache.list_pools() and hidden_segments(name) == []
    pools.keep(kvcache.restore(name, path, force=True))
    assert mode_of(name) == 0o666


def test_restore_into_a_configuration_of_the_callers_choosing(make_pool, pools, tmp_path):
    original = make_pool("2M", page_size="4K", policy="lfu")
    for i in range(10):
        original.put(f"k{i}", bytes([i]) * 100)
    path = kvcache.persist(original, tmp_path / "s.kvsnap")
    config = kvcache.PoolConfig.build(
        "1M", page_size="1K", policy="fifo", max_entries=5, default_ttl="1h"
    )
    restored, report = kvcache.restore_with_report(pools.name(), path, config=config)
    pools.keep(restored)
    assert restored.config == config
    assert (report.num_restored, report.num_dropped) == (5, 5)
    assert all(restored.get(key) == bytes([int(key[1:])]) * 100 for key in restored)
    with pytest.raises(InvalidArgument, match="not both"):
        kvcache.restore(pools.name(), path, size="1M", config=config)


def test_restore_with_prealloc_reserves_the_whole_pool(make_pool, pools, tmp_path):
    original = make_pool("64M")  # growth reserves 8 MiB at a time: well below 64M
    original.put("k", b"v")
    path = kvcache.persist(original, tmp_path / "s.kvsnap")
    lazy, eager = pools.name(), pools.name()
    pools.keep(kvcache.restore(lazy, path))
    pools.keep(kvcache.restore(eager, path, prealloc=True))
    assert (SHM / f"kvcache.{lazy}").stat().st_blocks * 512 < 32 << 20
    assert (SHM / f"kvcache.{eager}").stat().st_blocks * 512 >= 64 << 20


def test_missing_snapshot_is_a_snapshot_error_that_says_persist(pool_name, tmp_path, monkeypatch):
    with pytest.raises(SnapshotError, match="persist"):
        kvcache.restore(pool_name, tmp_path / "nothing-here.kvsnap")
    monkeypatch.setenv("KVCACHE_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(SnapshotError, match="persist"):
        kvcache.restore(pool_name)
    with pytest.raises(SnapshotError, match="persist"):
        kvcache.inspect_snapshot(tmp_path / "nothing-here.kvsnap")
    assert pool_name not in kvcache.list_pools()
    assert hidden_segments(pool_name) == []


def test_unwritable_destination_is_a_snapshot_error(make_pool, tmp_path):
    pool = make_pool("1M", page_size="4K")
    pool.put("a", b"1")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    with pytest.raises(SnapshotError, match="cannot create folder"):
        kvcache.persist(pool, blocker / "sub" / "p.kvsnap")
    assert blocker.read_bytes() == b"not a folder"


def test_restore_from_a_folder_is_a_snapshot_error(pool_name, tmp_path):
    with pytest.raises(SnapshotError):
        kvcache.restore(pool_name, tmp_path)
    assert pool_name not in kvcache.list_pools()


def test_bug_restore_from_a_fifo_hung(pool_name, tmp_path):
    """Regression: opening the snapshot blocked forever when the path was a named pipe."""
    fifo = tmp_path / "pipe.kvsnap"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            kvcache.restore(pool_name, fifo)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # unblock it so the test run can end, then fail
        with open(fifo, "wb"):
            pass
        thread.join(10)
        pytest.fail("restore from a FIFO blocked")
    assert len(outcome) == 1
    assert isinstance(outcome[0], SnapshotError)
    assert "regular file" in str(outcome[0])
    assert pool_name not in kvcache.list_pools()


def test_progress_is_reported_up_to_the_total(make_pool, pools, tmp_path):
    pool = make_pool("4M", page_size="4K")
    for i in range(20):
        pool.put(f"k{i}", b"x" * (i * 1000))
    written: list[tuple[int, int]] = []
    path = kvcache.persist(
        pool, tmp_path / "p.kvsnap", progress=lambda d, t: written.append((d, t))
    )
    data_bytes = kvcache.inspect_snapshot(path).data_bytes
    assert written[-1] == (data_bytes, data_bytes)
    assert [d for d, _ in written] == sorted(d for d, _ in written)
    read: list[tuple[int, int]] = []
    pools.keep(kvcache.restore(pools.name(), path, progress=lambda d, t: read.append((d, t))))
    assert read[-1] == (data_bytes, data_bytes)
    assert len(read) == 20


# ------------------------------------------------------------- durability

CHILD_PERSIST = """
import sys
import kvcache
pool = kvcache.open(sys.argv[1])
print("opened", flush=True)
kvcache.persist(pool, sys.argv[2])
print("persisted", flush=True)
"""


def test_process_killed_mid_persist_leaves_the_previous_snapshot(make_pool, pools, tmp_path):
    pool = make_pool("300M", page_size="64K")
    previous_values = {f"old-{i}": bytes([i]) * (i * 3000) for i in range(10)}
    for key, value in previous_values.items():
        pool.put(key, value)
    target = tmp_path / "pool.kvsnap"
    kvcache.persist(pool, target)
    previous = target.read_bytes()

    base = np.random.default_rng(3).bytes(1 << 20)
    for i in range(256):  # 256 MiB more to persist
        pool.put(f"big-{i}", i.to_bytes(8, "little") + base[8:])

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_PERSIST, pool.name, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    temps: list[Path] = []
    try:
        deadline = time.monotonic() + 60
        seen = 0
        while time.monotonic() < deadline and child.poll() is None:
            temps = list(tmp_path.glob(f".{target.name}.*.tmp"))
            if temps:
                try:
                    seen = temps[0].stat().st_size
                except FileNotFoundError:
                    seen = 0
                if seen >= 4 << 20:  # under way, and far from done (256 MiB to go)
                    break
            time.sleep(0.0005)
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL, (
            f"the child was not killed mid-write (rc {child.returncode}): {err.decode()[-2000:]}"
        )
        assert temps and seen >= 4 << 20, "no growing temporary file was seen"

        # the final name still holds the previous snapshot, byte for byte, and it restores
        assert target.read_bytes() == previous
        restored = pools.keep(kvcache.restore(pools.name(), target))
        assert sorted(restored.keys()) == sorted(previous_values)
        for key, value in previous_values.items():
            assert restored.get(key) == value
        # the leftover is only ever the hidden temporary file, and it is partial
        names = sorted(os.listdir(tmp_path))
        assert names[-1] == target.name
        assert all(n.startswith(f".{target.name}.") and n.endswith(".tmp") for n in names[:-1])
        total = 512 + kvcache.inspect_snapshot(target).data_bytes + (256 << 20)
        assert all((tmp_path / n).stat().st_size < total for n in names[:-1])
        # the pool the child was reading is intact and usable
        assert pool.check() == []
        assert pool.get("big-7")[:8] == (7).to_bytes(8, "little")
        pool.put("after-crash", b"ok")
        assert pool.get("after-crash") == b"ok"
        # the next persist to the same path removes the dead writer's leftover
        # (once older than the moment a writer takes between creating it and
        # leasing it: pretend the crash was a minute ago)
        for leftover in tmp_path.glob(".*.tmp"):
            _make_old(leftover)
        kvcache.persist(pool, target)
        assert sorted(os.listdir(tmp_path)) == [target.name]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for leftover in tmp_path.glob(".*.tmp"):
            leftover.unlink()  # do not leave hundreds of MiB in the pytest temp folder


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs mounted for the test (needs root: these tests run as root)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount_point)],
        check=True,
        capture_output=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, capture_output=True)


def test_full_disk_is_a_clear_error_and_keeps_the_previous_snapshot(
    make_pool, pools, tiny_filesystem
):
    pool = make_pool("4M", page_size="4K")
    pool.put("small", b"s" * 10_000)
    target = tiny_filesystem / "pool.kvsnap"
    kvcache.persist(pool, target)
    previous = target.read_bytes()

    rng = np.random.default_rng(9)
    for i in range(8):  # 1 MiB: cannot fit in 256 KiB
        pool.put(f"big-{i}", rng.bytes(128 << 10))
    with pytest.raises(SnapshotError, match="no space left") as caught:
        kvcache.persist(pool, target)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC

    assert os.listdir(tiny_filesystem) == [target.name]  # no temporary file left
    assert target.read_bytes() == previous
    restored = pools.keep(kvcache.restore(pools.name(), target))
    assert restored.keys() == ["small"]
    assert restored.get("small") == b"s" * 10_000
    assert pool.check() == []  # and the pool is fine
    assert pool.get("big-3") is not None


def _make_old(path: Path) -> None:
    """Set ``path``'s modification time a minute back, as if its writer died back then."""
    then = time.time() - 60
    os.utime(path, (then, then))


def test_a_live_writers_temporary_file_is_left_alone(make_pool, tmp_path):
    """Only temporary files whose writer's lease is gone are removed: a live persist keeps
    its own (the lease is an OFD lock, held here through a description of its own)."""
    pool = make_pool("1M")
    pool.put("a", b"1")
    target = tmp_path / "pool.kvsnap"
    live, dead = (tmp_path / f".{target.name}.{tag * 6}.tmp" for tag in ("ab", "cd"))
    fd = os.open(live, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        builds.hold(fd)
        dead.write_bytes(b"abandoned")
        for path in (live, dead):
            _make_old(path)
        kvcache.persist(pool, target)
        assert live.exists() and not dead.exists()
    finally:
        os.close(fd)
