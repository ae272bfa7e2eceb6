"""The Pool's public contract, on real /dev/shm pools."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

import kvcache
from kvcache import (
    InvalidArgument,
    PoolClosedError,
    PoolExistsError,
    PoolNotFoundError,
    ValueTooLargeError,
)


def test_bytes_round_trip_and_miss(make_pool):
    pool = make_pool()
    pool.put("prompt-42", b"kv-bytes")
    assert pool.get("prompt-42") == b"kv-bytes"
    assert pool.get("prompt-43") is None


@pytest.mark.parametrize(
    "value", [b"", bytearray(b"abc"), memoryview(b"xyz" * 1000), os.urandom(70_000)]
)
def test_bytes_like_values_come_back_as_bytes(make_pool, value):
    pool = make_pool()
    pool.put(b"k", value)
    got = pool.get(b"k")
    assert isinstance(got, bytes)
    assert got == bytes(value)


@pytest.mark.parametrize("size", [1, 1023, 1024, 1025, 4096 * 3 + 17, 200_000])
def test_values_spanning_pages_round_trip(make_pool, size):
    pool = make_pool(page_size="1K")
    value = os.urandom(size)
    pool.put("k", value)
    assert pool.get("k") == value
    buffer = bytearray(size + 10)
    assert pool.get_into("k", buffer) == size
    assert buffer[:size] == value


def test_pages_scattered_by_churn_still_read_back(make_pool):
    pool = make_pool(size="64K", page_size="1K")
    rng = random.Random(7)
    for i in range(40):  # interleave sizes so the free list is shuffled
        pool.put(f"small-{i}", os.urandom(rng.randint(1, 3000)))
        pool.delete(f"small-{i - 3}")
    value = os.urandom(20_000)
    pool.put("big", value)
    assert pool.get("big") == value
    assert pool.check() == []


def test_numpy_arrays_come_back_with_dtype_and_shape(make_pool):
    pool = make_pool()
    array = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    pool.put("kv", array)
    got = pool.get("kv")
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.float16 and got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, array)


def test_get_into_fills_a_numpy_buffer_without_the_header(make_pool):
    pool = make_pool()
    array = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    pool.put("kv", array)
    out = np.zeros_like(array)
    assert pool.get_into("kv", out) == array.nbytes
    np.testing.assert_array_equal(out, array)
    assert pool.get_into("missing", out) is None


def test_get_into_rejects_small_and_read_only_buffers(make_pool):
    pool = make_pool()
    pool.put("k", b"x" * 100)
    with pytest.raises(InvalidArgument, match="too small"):
        pool.get_into("k", bytearray(99))
    with pytest.raises(InvalidArgument, match="writable"):
        pool.get_into("k", b"\0" * 200)
    with pytest.raises(InvalidArgument):
        pool.get_into("k", 42)


def test_mapping_conventions(make_pool):
    pool = make_pool()
    pool["a"] = b"1"
    pool[b"b"] = b"2"
    assert pool["a"] == b"1"
    assert "a" in pool and b"b" in pool and "c" not in pool and 3 not in pool
    assert len(pool) == 2
    assert sorted(pool.keys(), key=repr) == sorted(["a", b"b"], key=repr)
    assert set(pool) == {"a", b"b"}
    del pool["a"]
    assert "a" not in pool and len(pool) == 1
    with pytest.raises(KeyError):
        del pool["a"]
    with pytest.raises(KeyError):
        pool["a"]
    assert pool.delete(b"b") is True and pool.delete(b"b") is False


def test_str_and_bytes_keys_are_the_same_utf8_key(make_pool):
    pool = make_pool()
    pool.put("naïve", b"1")
    assert pool.get("naïve".encode()) == b"1"


def test_put_replaces_and_frees_the_old_value(make_pool):
    pool = make_pool(page_size="1K")
    pool.put("k", b"x" * 10_000)
    pool.put("k", b"y" * 100)
    assert pool.get("k") == b"y" * 100
    assert len(pool) == 1
    assert pool.stats().used_bytes == 1024
    assert pool.check() == []


def test_stats_count_hits_misses_puts(make_pool):
    pool = make_pool()
    pool.put("a", b"1")
    pool.get("a")
    pool.get("a")
    pool.get("zzz")
    stats = pool.stats()
    assert (stats.hits, stats.misses, stats.puts) == (2, 1, 1)
    assert stats.hit_rate == pytest.approx(2 / 3)
    assert stats.num_entries == 1
    assert stats.used_bytes + stats.free_bytes == stats.size_bytes
    assert os.getpid() in stats.attached
    doc = json.loads(json.dumps(stats.to_dict()))
    assert doc["hit_rate"] == pytest.approx(2 / 3) and doc["name"] == pool.name


def test_membership_does_not_count_as_a_lookup(make_pool):
    pool = make_pool()
    pool.put("a", b"1")
    assert "a" in pool and "b" not in pool
    assert (pool.stats().hits, pool.stats().misses) == (0, 0)


def test_fills_past_capacity_by_evicting(make_pool):
    pool = make_pool(size="64K", page_size="4K")
    for i in range(100):
        pool.put(f"k{i}", bytes([i % 256]) * 4000)
        assert pool.stats().used_bytes <= pool.stats().size_bytes
    assert len(pool) == 16
    assert pool.stats().evictions == 84
    assert pool.get("k99") == bytes([99]) * 4000
    assert pool.check() == []


def test_a_value_as_large_as_the_pool_evicts_everything(make_pool):
    pool = make_pool(size="64K", page_size="4K")
    for i in range(16):
        pool.put(f"k{i}", b"x" * 4000)
    whole = os.urandom(64 * 1024 - 10)
    pool.put("whole", whole)
    assert pool.get("whole") == whole and len(pool) == 1


def test_value_larger_than_pool_is_a_clear_error_and_changes_nothing(make_pool):
    pool = make_pool(size="64K", page_size="4K")
    pool.put("keep", b"1")
    with pytest.raises(ValueTooLargeError, match="larger pool") as info:
        pool.put("big", b"x" * (64 * 1024))
    assert isinstance(info.value, ValueError)
    assert pool.get("keep") == b"1" and len(pool) == 1


def test_max_entries_caps_the_entry_table(make_pool):
    pool = make_pool(size="1M", page_size="1K", max_entries=4)
    for i in range(10):
        pool.put(f"k{i}", b"v")
    assert len(pool) == 4
    assert [pool.get(f"k{i}") for i in range(6, 10)] == [b"v"] * 4


def test_ttl_entries_expire_and_are_never_returned(make_pool, clock):
    pool = make_pool(clock=clock)
    pool.put("short", b"1", ttl=10)
    pool.put("words", b"2", ttl="1m")
    pool.put("forever", b"3")
    clock.advance(11)
    assert pool.get("short") is None and "short" not in pool
    assert "short" not in list(pool.keys())
    assert pool.get("words") == b"2"
    clock.advance(60)
    assert "words" not in pool
    assert pool.get("forever") == b"3"
    assert pool.stats().expirations >= 1


def test_default_ttl_applies_to_puts_without_one(make_pool, clock):
    pool = make_pool(clock=clock, default_ttl="30s")
    pool.put("a", b"1")
    pool.put("b", b"2", ttl=3600)
    clock.advance(31)
    assert pool.get("a") is None and pool.get("b") == b"2"


def test_evict_expired_reports_what_it_removed(make_pool, clock):
    pool = make_pool(clock=clock, page_size="1K")
    for i in range(5):
        pool.put(f"t{i}", b"x" * 100, ttl=5)
    pool.put("keep", b"y")
    clock.advance(6)
    result = pool.evict(expired=True)
    assert (result.num_expired, result.num_entries, result.num_bytes) == (5, 0, 5 * 1024)
    assert pool.keys() == ["keep"] and len(pool) == 1
    assert pool.stats().expirations == 5


def test_evict_percent_frees_that_share_of_used_bytes(make_pool):
    pool = make_pool(size="1M", page_size="1K")
    for i in range(100):
        pool.put(f"k{i}", b"x" * 1000)
    result = pool.evict(percent=25)
    assert result.num_entries == 25 and result.num_bytes == 25 * 1024
    assert len(pool) == 75
    assert all(f"k{i}" not in pool for i in range(25))  # LRU: the oldest went
    assert pool.stats().evictions == 25
    assert pool.check() == []


def test_evict_bytes_frees_at_least_that_much(make_pool):
    pool = make_pool(size="1M", page_size="1K")
    for i in range(50):
        pool.put(f"k{i}", b"x" * 1000)
    result = pool.evict(bytes="10K")
    assert result.num_bytes >= 10 * 1024 and result.num_entries == 10
    assert pool.evict(bytes="1G").num_entries == 40 and len(pool) == 0


def test_evict_counts_expired_entries_toward_the_target(make_pool, clock):
    pool = make_pool(clock=clock, page_size="1K")
    pool.put("old", b"x", ttl=1)
    pool.put("new", b"y")
    clock.advance(2)
    result = pool.evict(bytes="1K")
    assert (result.num_expired, result.num_entries) == (1, 0)
    assert pool.get("new") == b"y"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"percent": 0},
        {"percent": -5},
        {"percent": 101},
        {"percent": "abc"},
        {"percent": True},
        {"percent": float("nan")},
        {"bytes": "-1"},
        {"bytes": "lots"},
        {"bytes": 0},
        {"percent": 10, "bytes": "1K"},
        {"percent": 10, "expired": True},
    ],
)
def test_evict_rejects_bad_targets_and_changes_nothing(make_pool, kwargs):
    pool = make_pool()
    pool.put("a", b"1")
    with pytest.raises(InvalidArgument):
        pool.evict(**kwargs)
    assert pool.get("a") == b"1"


@pytest.mark.parametrize("key", ["", b"", "x" * 1025, 42, None, 1.5, ("a",)])
def test_bad_keys_are_rejected(make_pool, key):
    pool = make_pool()
    with pytest.raises(InvalidArgument, match="key"):
        pool.put(key, b"v")
    with pytest.raises(InvalidArgument):
        pool.get(key)
    assert len(pool) == 0


@pytest.mark.parametrize(
    "value", ["text", 42, None, [1, 2], {"a": 1}, np.array(["a"], dtype=object)]
)
def test_bad_values_are_rejected(make_pool, value):
    pool = make_pool()
    with pytest.raises(InvalidArgument):
        pool.put("k", value)
    assert len(pool) == 0 and pool.stats().used_bytes == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"priority": 1.5},
        {"priority": "high"},
        {"priority": True},
        {"ttl": 0},
        {"ttl": -3},
        {"ttl": "soon"},
    ],
)
def test_bad_put_options_are_rejected(make_pool, kwargs):
    pool = make_pool()
    with pytest.raises(InvalidArgument):
        pool.put("k", b"v", **kwargs)
    assert "k" not in pool


def test_create_open_list_destroy(pool_name):
    with kvcache.create(pool_name, "1M") as pool:
        pool.put("a", b"1")
        assert pool_name in kvcache.list_pools()
        with pytest.raises(PoolExistsError, match="already exists"):
            kvcache.create(pool_name, "1M")
        with kvcache.open(pool_name) as other:
            assert other.get("a") == b"1"
            assert other.config == pool.config
    kvcache.destroy(pool_name)
    assert pool_name not in kvcache.list_pools()
    with pytest.raises(PoolNotFoundError, match="kvcache create"):
        kvcache.open(pool_name)
    with pytest.raises(PoolNotFoundError):
        kvcache.destroy(pool_name)


def test_pool_outlives_its_creator_object(pool_name):
    kvcache.create(pool_name, "1M").close()
    with kvcache.open(pool_name) as pool:
        pool.put("a", b"1")
    with kvcache.open(pool_name) as pool:
        assert pool.get("a") == b"1"
    kvcache.destroy(pool_name)


def test_closed_pool_says_so(make_pool):
    pool = make_pool()
    pool.close()
    pool.close()  # idempotent
    for use in (lambda: pool.get("a"), lambda: pool.put("a", b"1"), lambda: len(pool), pool.stats):
        with pytest.raises(PoolClosedError, match="open"):
            use()
    assert "closed" in repr(pool)


def test_bug_a_latency_sample_of_a_call_that_a_close_overtook_raised_attribute_error(make_pool):
    """The multiprocess close test found it: a reader thread's get, timed, finished as
    another thread closed the pool, and its sample asked the closed pool's lock whether
    another process held the word: AttributeError. The sample now stays with the closed
    handle, which adds it to no region."""
    pool = make_pool()
    engine = pool._engine
    pool.close()
    engine.add_sample(0, 1_000)  # the call succeeded before the close: no error for it
    assert engine.samples == [(0, 1_000)]  # kept with the handle, which no region takes


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": "0"},
        {"size": ""},
        {"size": "-1G"},
        {"size": "lots"},
        {"size": "2P"},
        {"size": "1M", "page_size": "3K"},
        {"size": "1M", "page_size": "512"},
        {"size": "1K", "page_size": "4K"},
        {"size": "1M", "policy": "random"},
        {"size": "1M", "policy": None},
        {"size": "1M", "max_entries": 0},
        {"size": "1M", "max_entries": 1.5},
        {"size": "1M", "default_ttl": "forever"},
        {"size": "1M", "eviction_samples": 0},
        {"size": "1M", "mode": 0o1777},
        {"size": "1M", "mode": 0o777},  # execute bits and world-writable KV
        {"size": "1M", "mode": 0o666},  # other users need force=True
    ],
)
def test_bad_create_arguments_create_nothing(pool_name, kwargs):
    with pytest.raises(InvalidArgument) as info:
        kvcache.create(pool_name, **kwargs)
    assert isinstance(info.value, ValueError)
    assert pool_name not in kvcache.list_pools()


@pytest.mark.parametrize("name", ["", "../etc", "a/b", ".hidden", "x" * 101, "sp ace", None])
def test_bad_names_are_rejected_everywhere(name):
    for call in (
        lambda: kvcache.create(name, "1M"),
        lambda: kvcache.open(name),
        lambda: kvcache.destroy(name),
    ):
        with pytest.raises(InvalidArgument, match="name"):
            call()


def test_behaves_like_a_dict_when_nothing_is_evicted(make_pool):
    """A random operation sequence against a dict model, in a pool too big to evict."""
    pool = make_pool(size="8M", page_size="1K")
    model: dict[str, bytes] = {}
    rng = random.Random(1)
    for _ in range(2000):
        key = f"k{rng.randrange(60)}"
        op = rng.random()
        if op < 0.5:
            value = rng.randbytes(rng.choice([0, 1, 500, 1024, 3000, 70_000]))
            pool.put(key, value)
            model[key] = value
        elif op < 0.8:
            assert pool.get(key) == model.get(key)
        else:
            assert pool.delete(key) == (model.pop(key, None) is not None)
    assert sorted(pool.keys()) == sorted(model)
    assert pool.check() == []
    pages = sum(max(1, -(-(len(k) + len(v)) // 1024)) for k, v in model.items())
    assert pool.stats().used_bytes == pages * 1024


def test_check_reports_and_repairs_a_broken_counter(make_pool):
    pool = make_pool()
    pool.put("a", b"1")
    from kvcache.layout import H

    pool._engine.views.header_q[H.used_pages] += 3  # white-box: corrupt a derived counter
    problems = pool.check()
    assert problems and "used pages" in problems[0]
    assert pool.check(repair=True) == problems
    assert pool.check() == [] and pool.get("a") == b"1"
    assert pool.stats().repairs == 1


def test_numpy_scalars_come_back_as_zero_d_arrays(make_pool):
    pool = make_pool()
    pool.put("x", np.float64(1.5))
    got = pool.get("x")
    assert (
        isinstance(got, np.ndarray) and got.shape == () and got.dtype == np.float64 and got == 1.5
    )


@pytest.mark.parametrize("key", ["\ud800", "ok\udcff", "\udfff" * 3])
def test_regression_lone_surrogate_keys_raised_unicode_encode_error(make_pool, key):
    """Text that UTF-8 cannot encode (what ``surrogateescape`` decoding makes of bad bytes)."""
    pool = make_pool()
    pool.put("kept", b"v")
    uses = [
        lambda: pool.put(key, b"v"),
        lambda: pool.get(key),
        lambda: pool.delete(key),
        lambda: pool.get_into(key, bytearray(8)),
        lambda: key in pool,
        lambda: pool.pop(key, None),
    ]
    for use in uses:
        with pytest.raises(InvalidArgument, match=r"lone surrogate at position .*pass the key as"):
            use()
    assert list(pool) == ["kept"]
