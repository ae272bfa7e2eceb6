"""Pool as a MutableMapping: get(default), pop, popitem, clear, touch, ttl, views, update."""

from __future__ import annotations

import math
import os
from collections.abc import MutableMapping, Set

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument
from kvcache.engine.eviction import EVICT_BATCH
from kvcache.layout import H
from kvcache.mapping import KeyList

# ------------------------------------------------------------ get and pop


def test_get_returns_the_default_on_a_miss(make_pool):
    pool = make_pool()
    pool.put("k", b"v")
    assert pool.get("k", b"default") == b"v"
    assert pool.get("absent", b"default") == b"default"
    assert pool.get("absent") is None
    assert pool.get(key="absent", default=0) == 0


@pytest.mark.parametrize("size", [10, 200_000])  # under the lock, and the seqlock copy
def test_pop_returns_the_value_and_removes_it(make_pool, size):
    pool = make_pool()
    value = os.urandom(size)
    pool.put("k", value)
    assert pool.pop("k") == value
    assert "k" not in pool and len(pool) == 0
    assert pool.stats().used_bytes == 0
    assert pool.check() == []


def test_pop_of_a_missing_or_expired_key(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("short", b"v", ttl=5)
    clock.advance(6)
    assert pool.pop("short", None) is None
    assert pool.pop("never", "fallback") == "fallback"
    with pytest.raises(KeyError, match="never"):
        pool.pop("never")
    assert pool.check() == []


def test_pop_counts_as_a_read(make_pool):
    pool = make_pool()
    pool.put("k", b"v")
    pool.pop("k")
    pool.pop("k", None)
    assert (pool.stats().hits, pool.stats().misses) == (1, 1)


def test_pop_returns_the_value_it_removes_when_another_handle_replaces_it(make_pool):
    pool = make_pool()
    pool.put("k", b"old")
    other = kvcache.open(pool.name)
    store = pool._engine  # pop copies the value with its store's read
    read = store.read

    def replaced_before_the_copy(key, copy):
        store.read = read  # once: the next attempt reads undisturbed
        other.put("k", b"new")
        return read(key, copy)

    store.read = replaced_before_the_copy
    try:
        # the entry noted before the copy is gone: the pop must retry, not
        # return b"new" while freeing the old (already freed) entry
        assert pool.pop("k") == b"new"
    finally:
        other.close()
    assert "k" not in pool and pool.check() == []


def test_popitem_empties_the_pool_pair_by_pair(make_pool):
    pool = make_pool()
    stored = {f"k{i}": bytes([i]) * 10 for i in range(5)}
    pool.update(stored)
    popped = dict(pool.popitem() for _ in range(5))
    assert popped == stored
    with pytest.raises(KeyError, match="empty"):
        pool.popitem()
    assert pool.check() == []


# ------------------------------------------------------------------ clear


def test_clear_removes_everything_and_says_how_many(make_pool):
    pool = make_pool(size="4M", page_size="1K")
    for i in range(100):
        pool.put(f"k{i}", os.urandom(i * 50))
    before = pool.stats()
    assert pool.clear() == 100
    after = pool.stats()
    assert len(pool) == 0 and pool.keys() == [] and after.used_bytes == 0
    assert after.evictions == before.evictions  # not counted as evictions (like delete)
    assert pool.check() == []
    pool.put("again", b"v")  # and the pool works on
    assert pool.get("again") == b"v"
    assert pool.clear() == 1 and pool.clear() == 0


class _LiveCountAtEachLock:
    """Wraps a pool's lock, noting how many entries are live each time it is taken."""

    def __init__(self, pool: kvcache.Pool) -> None:
        self.pool, self.lock, self.seen = pool, pool._engine.lock, []

    def __enter__(self) -> None:
        self.lock.__enter__()
        self.seen.append(self.pool._engine.views.header_q[H.num_live])

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)


def test_clear_releases_the_lock_between_batches(make_pool):
    num_entries = 2 * EVICT_BATCH + 100
    pool = make_pool(size="4M", page_size="1K")
    for i in range(num_entries):
        pool.put(f"k{i}", b"v")
    recorder = _LiveCountAtEachLock(pool)
    pool._engine.lock = recorder
    try:
        assert pool.clear() == num_entries
    finally:
        pool._engine.lock = recorder.lock
    removed_per_hold = -np.diff([*recorder.seen, 0])
    assert removed_per_hold.max() <= EVICT_BATCH
    assert len(recorder.seen) >= 1 + math.ceil(num_entries / EVICT_BATCH)
    assert pool.check() == []


# ------------------------------------------------------------ touch and ttl


def test_ttl_says_what_is_left(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("timed", b"v", ttl=60)
    pool.put("forever", b"v")
    clock.advance(15)
    assert pool.ttl("timed") == 45.0
    assert pool.ttl("forever") is None
    assert (pool.stats().hits, pool.stats().misses) == (0, 0)
    clock.advance(45)
    with pytest.raises(KeyError, match="timed"):
        pool.ttl("timed")  # expired at exactly its time, like get
    with pytest.raises(KeyError):
        pool.ttl("absent")


def test_touch_sets_a_new_expiry_and_keeps_the_value(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("k", b"v", ttl=10)
    clock.advance(5)
    assert pool.touch("k", ttl=100) is True
    assert pool.ttl("k") == 100.0
    clock.advance(50)  # past the first expiry
    assert pool.get("k") == b"v"
    assert pool.touch("k", ttl="1m") is True and pool.ttl("k") == 60.0
    assert pool.touch("k") is True and pool.ttl("k") is None  # no default ttl: never
    assert pool.touch("absent", ttl=5) is False
    assert "absent" not in pool


def test_touch_without_a_ttl_restarts_the_pool_default(make_pool, clock):
    pool = make_pool(clock=clock, default_ttl="30s")
    pool.put("k", b"v")
    clock.advance(20)
    assert pool.touch("k") is True
    assert pool.ttl("k") == 30.0


def test_touch_of_an_expired_key_fails(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("k", b"v", ttl=5)
    clock.advance(5)
    assert pool.touch("k", ttl=100) is False
    assert "k" not in pool and len(pool) == 0


def test_touch_refuses_a_bad_ttl_and_changes_nothing(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("k", b"v", ttl=10)
    for bad in (0, -1, "soon", math.inf, True):
        with pytest.raises(InvalidArgument, match="ttl"):
            pool.touch("k", ttl=bad)
    assert pool.ttl("k") == 10.0


def test_an_earlier_expiry_from_touch_is_swept_as_an_expiration(make_pool, clock):
    # the sweep on put skips the scan while the header's next expiry is in the
    # future: touch must lower it, or the entry is evicted instead of expired
    pool = make_pool(size="16K", page_size="4K", clock=clock)
    pool.put("old", b"v")
    assert pool.touch("old", ttl=5)
    clock.advance(6)
    for i in range(4):  # the fourth needs the page "old" holds
        pool.put(f"k{i}", b"v" * 4000)
    stats = pool.stats()
    assert (stats.expirations, stats.evictions) == (1, 0)
    assert all(f"k{i}" in pool for i in range(4))


# ------------------------------------------------------------------ views


def test_items_and_values_list_the_pool(make_pool):
    pool = make_pool()
    stored = {"a": b"1", b"b": b"2", "arr": np.arange(6, dtype=np.int32).reshape(2, 3)}
    pool.update(stored)
    items = dict(pool.items())
    assert items.keys() == stored.keys()
    assert items["a"] == b"1" and items[b"b"] == b"2"
    np.testing.assert_array_equal(items["arr"], stored["arr"])
    assert len(pool.items()) == len(pool.values()) == 3
    assert sorted(v for v in pool.values() if isinstance(v, bytes)) == [b"1", b"2"]


def test_view_membership_compares_arrays_by_contents(make_pool):
    pool = make_pool()
    pool.put("a", b"1")
    pool.put("arr", np.arange(4, dtype=np.int64))
    assert ("a", b"1") in pool.items() and ("a", b"2") not in pool.items()
    assert ("arr", np.arange(4, dtype=np.int64)) in pool.items()
    assert ("arr", np.arange(4, dtype=np.int32)) not in pool.items()  # dtype matters
    assert ("absent", b"1") not in pool.items() and (1, 2, 3) not in pool.items()
    assert np.arange(4, dtype=np.int64) in pool.values() and b"1" in pool.values()
    assert np.arange(5) not in pool.values() and b"3" not in pool.values()


@pytest.mark.parametrize("view", ["items", "values"])
def test_views_skip_keys_removed_while_iterating(make_pool, view):
    pool = make_pool()
    pool.update({f"k{i}": f"k{i}".encode() for i in range(5)})
    other = kvcache.open(pool.name)
    try:
        seen = []
        for item in getattr(pool, view)():
            seen.append(item[0] if view == "items" else item.decode())
            for i in range(5):  # another handle removes every key not yet seen
                if f"k{i}" not in seen:
                    other.delete(f"k{i}")
    finally:
        other.close()
    assert len(seen) == 1


def test_values_are_read_when_iteration_reaches_them(make_pool):
    pool = make_pool()
    pool.update({f"k{i}": b"old" for i in range(5)})
    seen = []
    for value in pool.values():
        seen.append(value)
        # the same handle writes inside the loop: the view holds no lock meanwhile
        for i in range(5):
            pool.put(f"k{i}", b"new")
    assert seen == [b"old"] + [b"new"] * 4


# ---------------------------------------------------------- the mapping ABC


def test_a_pool_is_a_mutable_mapping_with_put_semantics(make_pool, clock):
    pool = make_pool(clock=clock, default_ttl="1h")
    assert isinstance(pool, MutableMapping)
    pool.update({"a": b"1"}, b=b"2")
    pool.update([("c", b"3")])
    assert pool.ttl("a") == pool.ttl("b") == pool.ttl("c") == 3600.0  # the pool's default
    assert pool.setdefault("a", b"other") == b"1"
    assert pool.setdefault("d", b"4") == b"4" and pool["d"] == b"4"
    assert dict(pool) == {"a": b"1", "b": b"2", "c": b"3", "d": b"4"}
    with pytest.raises(InvalidArgument):
        pool.setdefault("e")  # None is not a value
    assert "e" not in pool


def test_pools_compare_by_identity_and_stay_hashable(make_pool):
    pool = make_pool()
    other = kvcache.open(pool.name)
    try:
        assert pool == pool and pool != other  # handles, not their contents
        assert len({pool, other}) == 2
    finally:
        other.close()


def test_keys_is_a_list_and_a_set(make_pool):
    pool = make_pool()
    pool.update({"a": b"1", "b": b"2"})
    keys = pool.keys()
    assert isinstance(keys, list) and isinstance(keys, Set)
    assert sorted(keys) == ["a", "b"] and keys[0] in ("a", "b")
    assert keys == {"a", "b"} and keys != {"a"} and keys <= {"a", "b", "c"} and keys < {*"abc"}
    assert keys & {"a", "z"} == {"a"} and keys | {"z"} == {"a", "b", "z"}
    assert keys - {"a"} == {"b"} and keys ^ {"a", "z"} == {"b", "z"}
    assert keys.isdisjoint({"z"}) and not keys.isdisjoint({"a"})
    assert KeyList(["a"]) == ["a"] and KeyList(["a"]) != ["b"]  # as a list, against lists
