"""Small values packed into inline slots (``--inline-bytes``): real pools in /dev/shm.

An entry whose key, codec header and value fit its slot takes no page; a larger one
takes pages as before. Both engines write and read the slots alike (test_fastpath's
differential and damage tests run with slots too); here: where entries go, that a pool
may then hold more entries than pages, eviction for slots, snapshots, the format,
repair of a damaged slot entry, the command line, and bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import IncompatiblePoolError, InvalidArgument
from kvcache.keys import key_hash
from kvcache.layout import ENTRY_WORDS, E, H
from pool_files import set_format_version

CORTEX = [sys.executable, "-m", "kvcache"]


def pages_of(pool: kvcache.Pool, key: str) -> int:
    """The pages ``key``'s entry holds (0: its inline slot)."""
    eid = pool._engine.table.index.find(*key_hash(key.encode()))
    assert eid >= 0
    return int(pool._engine.views.entries_q[eid * ENTRY_WORDS + E.num_pages])


def test_small_values_take_no_page_and_larger_ones_take_pages(make_pool) -> None:
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=1000)
    pool.put("tiny", b"t" * 64)  # 4 + 64 bytes: in the slot
    pool.put("edge", b"e" * 124)  # 4 + 124 = 128: still in the slot
    pool.put("over", b"o" * 125)  # 129: a page
    pool.put("array", np.arange(8, dtype=np.int16))  # a codec header too, 16 bytes of payload
    assert [pages_of(pool, key) for key in ("tiny", "edge", "over", "array")] == [0, 0, 1, 0]
    assert pool._engine.views.header_q[H.used_pages] == 1
    assert pool.get("tiny") == b"t" * 64 and pool.get("edge") == b"e" * 124
    assert pool.get("over") == b"o" * 125
    assert np.array_equal(pool.get("array"), np.arange(8, dtype=np.int16))
    target = bytearray(200)
    assert pool.get_into("edge", target) == 124 and bytes(target[:124]) == b"e" * 124
    assert "tiny" in pool and "absent" not in pool
    assert pool.check() == []


def test_slots_that_are_not_whole_cache_lines_keep_their_neighbours_bytes(make_pool) -> None:
    """80-byte slots hold a 12-byte key and 68 bytes of value exactly, and share cache
    lines: rewriting one slot leaves the slots beside it as they were."""
    pool = make_pool("64K", page_size="1K", inline_bytes=80, max_entries=400)
    keys = [f"key-{i:08d}" for i in range(300)]
    for i, key in enumerate(keys):
        pool.put(key, bytes([i % 251]) * 68)
    assert pool._engine.views.header_q[H.used_pages] == 0  # every one in its slot
    for key in keys[::3]:
        pool.put(key, b"\xff" * 64)  # rewritten: to a new slot, beside others
    pool.put("key-00000001", b"x" * 69)  # one byte over: a page
    assert pages_of(pool, "key-00000001") == 1
    for i, key in enumerate(keys):
        expected = b"x" * 69 if i == 1 else b"\xff" * 64 if i % 3 == 0 else bytes([i % 251]) * 68
        assert pool.get(key) == expected
    stats = pool.stats()
    assert stats.evictions == stats.damaged == 0 and pool.check() == []


def test_a_key_moves_between_its_slot_and_pages_as_its_value_grows_and_shrinks(
    make_pool,
) -> None:
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=1000)
    for size, pages in ((10, 0), (3000, 3), (20, 0), (500, 1), (0, 0)):
        pool.put("key", bytes([size % 251]) * size)
        assert pages_of(pool, "key") == pages
        assert pool.get("key") == bytes([size % 251]) * size
        assert pool._engine.views.header_q[H.used_pages] == pages  # nothing leaked
    assert pool.pop("key") == b"" and "key" not in pool
    assert len(pool) == 0 and pool.check() == []


def test_a_pool_with_slots_holds_more_entries_than_pages_and_evicts_for_slots(make_pool) -> None:
    pool = make_pool("16K", page_size="1K", inline_bytes=64, max_entries=2000)
    for i in range(2500):
        pool.put(f"k{i}", i.to_bytes(4, "little") * 8)  # 32 bytes and a key of 2-5
    stats = pool.stats()
    assert 2000 - 32 <= stats.num_entries <= 2000  # evicted in batches of up to 16 (of 16 pages)
    assert stats.evictions == 2500 - stats.num_entries
    assert pool._engine.views.header_q[H.used_pages] == 0  # not one page
    assert stats.size_bytes == 16 * 1024 + 2000 * 64  # the pages and every entry's slot
    assert stats.used_bytes == stats.num_entries * 64  # the slots held
    assert stats.free_bytes == stats.size_bytes - stats.used_bytes
    assert pool.get("k2499") == (2499).to_bytes(4, "little") * 8  # the newest is kept (lru)
    pool.put("page", b"p" * 5000)  # the pages are all still free for a larger value
    assert pool.get("page") == b"p" * 5000
    assert pool.check() == []


def test_an_explicit_eviction_counts_the_slots_entries_hold(make_pool) -> None:
    """``evict --percent`` and ``--bytes`` measure slots as they measure pages: a pool of
    small values holds its slots, not nothing."""
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=1000)
    for i in range(100):
        pool.put(f"k{i:03d}", b"v" * 64)
    pool.put("paged", b"p" * 2000)  # two pages: 2 KiB of the 14.5 KiB held
    result = pool.evict(percent=50)
    assert result.num_bytes >= (100 * 128 + 2048) / 2 and len(pool) < 60
    before = len(pool)
    result = pool.evict(bytes=10 * 128)
    assert result.num_bytes >= 1280 and before - len(pool) == result.num_entries <= 10
    for i in range(3):
        pool.put(f"brief{i}", b"b", ttl=0.001)
    time.sleep(0.01)
    result = pool.evict(expired=True)  # expired entries free their slots too
    assert (result.num_expired, result.num_bytes) == (3, 3 * 128)
    assert pool.check() == []


def test_persist_and_restore_keep_the_slots(make_pool, pool_name, tmp_path: Path) -> None:
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=500)
    values = {f"k{i}": bytes([i]) * (i * 20) for i in range(1, 12)}  # slot and pages both
    for key, value in values.items():
        pool.put(key, value)
    path = kvcache.persist(pool, tmp_path / "inline.kvsnap")
    pool.close()
    kvcache.destroy(pool_name)
    restored = kvcache.restore(pool_name, path)
    try:
        assert restored.config.inline_bytes == 128 and restored.config.max_entries == 500
        assert {key: restored.get(key) for key in values} == values
        assert [pages_of(restored, key) for key in values] == [
            0 if len(key) + len(value) <= 128 else -(-(len(key) + len(value)) // 1024)
            for key, value in values.items()
        ]
        assert restored.check() == []
    finally:
        restored.close()


@pytest.mark.parametrize("policy", ["lru", "prefix"])
def test_only_a_pool_with_slots_is_written_as_format_13(names, policy) -> None:
    plain, slotted = names(), names()
    with kvcache.create(plain, "64K", page_size="1K", policy=policy) as pool:
        assert pool._engine.views.header_q[H.format_version] == (12 if policy == "prefix" else 10)
    with kvcache.create(slotted, "64K", page_size="1K", inline_bytes=64, policy=policy) as pool:
        path = pool.path
        assert pool._engine.views.header_q[H.format_version] == 13
    # a kvcache that reads 10, 11 or 12 keeps no count of the slots held: refused either way
    for older in (10, 11, 12):
        set_format_version(path, older)
        with pytest.raises(IncompatiblePoolError, match=f"format version {older}, this kvcache"):
            kvcache.open(slotted)


def test_the_slots_held_are_counted_where_entries_come_and_go(make_pool) -> None:
    """The header's count of entries in slots follows puts, replacements, deletes, moves
    between slot and pages, evictions and expiry, so ``stats`` reads two words."""
    pool = make_pool("16K", page_size="1K", inline_bytes=64, max_entries=64)

    def counted() -> tuple[int, int]:
        v, live = pool._engine.views, pool._engine.table.entries.live_ids()
        in_slots = np.count_nonzero(v.entries["num_pages"][live] == 0)
        return int(v.header_q[H.used_slots]), int(in_slots)

    for i in range(40):  # more than the pages: the small ones stay, some big ones go
        pool.put(f"k{i}", b"s" * 10 if i % 3 else b"b" * 1500)
        assert counted()[0] == counted()[1]
    pool.put("k1", b"b" * 1500)  # from its slot to pages
    pool.put("k0", b"s")  # from pages to its slot
    del pool["k38"]
    pool.put("gone", b"t", ttl=0.001)
    time.sleep(0.01)
    pool.evict(percent=50)
    held, slots = counted()
    assert held == slots > 0
    assert pool.stats().used_bytes == pool._engine.views.header_q[H.used_pages] * 1024 + slots * 64
    assert pool.check() == []
    pool._engine.views.header_q[H.used_slots] = 5  # damaged: reported, and repair counts again
    assert f"used slots counter is 5, entries hold {slots}" in pool.check()
    pool.check(repair=True)
    assert counted() == (slots, slots) and pool.check() == []


def test_a_slot_entry_claiming_a_page_is_reported_and_repair_drops_it_alone(make_pool) -> None:
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=100)
    pool.put("victim", b"v" * 50)
    pool.put("other", b"o" * 50)
    pool.put("paged", b"p" * 2000)
    eid = pool._engine.table.index.find(*key_hash(b"victim"))
    pool._engine.views.entries_q[eid * ENTRY_WORDS + E.num_pages] = 1
    problems = pool.check()
    assert any(f"entry {eid}: lengths" in problem for problem in problems), problems
    assert pool.get("victim") is None  # its key is not where its record says: never served
    assert pool.check(repair=True) == problems
    assert pool.check() == [] and "victim" not in pool
    assert pool.get("other") == b"o" * 50 and pool.get("paged") == b"p" * 2000


def test_a_damaged_slot_byte_is_a_counted_miss(make_pool) -> None:
    pool = make_pool("64K", page_size="1K", inline_bytes=128, max_entries=100)
    pool.put("key", b"k" * 100)
    eid = pool._engine.table.index.find(*key_hash(b"key"))
    table = pool._engine.table
    start = table.extents(eid)[0][0]
    table.data[start + 50] ^= 0xFF  # a stray write into the slot's payload
    assert pool.get("key") is None  # small values are verified by default
    assert pool.stats().damaged == 1 and "key" not in pool


def test_a_disk_pool_keeps_its_slot_entries_across_a_reopen(disk: Path, names) -> None:
    name = names()
    with kvcache.create(
        name, "64K", page_size="1K", tier="disk", path=disk, inline_bytes=64
    ) as pool:
        pool.put("small", b"s" * 40)
        pool.put("large", b"L" * 3000)
        assert pages_of(pool, "small") == 0 and pages_of(pool, "large") == 3
    with kvcache.open(name) as pool:  # read back from the file (keys with pread)
        assert pool.get("small") == b"s" * 40 and pool.get("large") == b"L" * 3000
        assert sorted(pool.keys()) == ["large", "small"]
        assert pool.check() == []


def test_entries_move_between_a_pool_with_slots_and_one_without(names) -> None:
    lower, upper = names(), names()
    kvcache.create(lower, "64K", page_size="1K").close()  # no slots: a page each
    with kvcache.create(
        upper, "16K", page_size="1K", inline_bytes=64, max_entries=20, spill_to=lower
    ) as pool:
        for i in range(40):  # twice the upper pool's entries: half spill down
            pool.put(f"k{i:02d}", bytes([i]) * 40)
        assert pool.stats().spills >= 20
        with kvcache.open(lower, chain=False) as below:
            moved = sorted(below.keys())
            assert moved and all(below.get(key) == bytes([int(key[1:])]) * 40 for key in moved)
            assert below._engine.views.header_q[H.used_pages] == len(moved)  # a page each there
        assert pool.get(moved[0]) == bytes([int(moved[0][1:])]) * 40  # promoted: a slot again
        assert pages_of(pool, moved[0]) == 0
        assert pool.check() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inline_bytes": 100}, "inline bytes must be 0 or a multiple of 16"),
        ({"inline_bytes": 8}, "a multiple of 16 from 16 to"),
        ({"inline_bytes": 8192, "page_size": "64K"}, "from 16 to 4096"),
        ({"inline_bytes": 1024, "page_size": "1K"}, "from 16 to 512"),
        ({"max_entries": 100, "page_size": "1K"}, "unless the pool has inline slots"),
        ({"max_entries": (1 << 30) + 1, "inline_bytes": 64, "page_size": "1K"}, "1 to 1073741824"),
    ],
)
def test_bad_slot_settings_are_refused_with_what_to_do(options, message) -> None:
    with pytest.raises(InvalidArgument, match=message):
        kvcache.PoolConfig.build("64K", **options)


def run_cortex(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORTEX, "cache", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_command_line_creates_a_pool_with_slots(names: Callable[[], str]) -> None:
    name = names()
    created = run_cortex(
        "create", name, "--size", "64K", "--page-size", "1K", "--inline-bytes", "128",
        "--max-entries", "5000",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "up to 5000 entries, 128-byte inline slots (625K)" in created.stdout
    with kvcache.open(name) as pool:
        assert pool.config.inline_bytes == 128
        for i in range(3000):  # more than the pool's 64 pages could hold one by one
            pool.put(f"k{i}", b"x" * 64)
        assert len(pool) == 3000
    status = run_cortex("status", name, "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["config"]["inline_bytes"] == 128
    assert doc["size_bytes"] == 64 * 1024 + 5000 * 128 and doc["used_bytes"] == 3000 * 128
    human = run_cortex("status", name).stdout
    assert "inline slots" in human and "128 B each" in human and "3000 of 5000" in human
    assert "689K (64.0K pages, 625K slots)" in human and "375K (54.4%)" in human
    listed = run_cortex("list").stdout.splitlines()
    assert [line.split()[1:3] for line in listed if line.startswith(name)] == [["689K", "375K"]]


def test_bad_inline_bytes_on_the_command_line_is_one_line_and_no_pool(names) -> None:
    name = names()
    result = run_cortex("create", name, "--size", "64K", "--inline-bytes", "100")
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "multiple of 16" in result.stderr
    assert "Traceback" not in result.stderr and name not in kvcache.list_pools()
