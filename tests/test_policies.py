"""Eviction policies: one contract suite for all, then each policy's own order.

Pools here hold at most ``eviction_samples`` entries, so eviction ranks every
entry and the expected victim is exact; sampling on larger pools is tested
at the end.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument
from kvcache.layout import H
from kvcache.policies import EVICTION_BATCH, POLICIES, get_policy

PAGE = 1024
SLOTS = 8  # the pool holds 8 one-page entries


@pytest.fixture
def small_pool(make_pool, clock):
    def make(policy: str, **kwargs):
        return make_pool(size=SLOTS * PAGE, page_size=PAGE, policy=policy, clock=clock, **kwargs)

    return make


def fill(pool, count=SLOTS, **put_kwargs):
    for i in range(count):
        pool.put(f"k{i}", b"v" * 100, **put_kwargs)


def survivors(pool):
    return set(pool.keys())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_keeps_the_pool_consistent_under_churn(small_pool, policy):
    pool = small_pool(policy)
    rng = np.random.default_rng(3)
    for i in range(300):
        size = int(rng.integers(1, 3 * PAGE))
        pool.put(
            f"k{rng.integers(40)}",
            bytes(size),
            priority=int(rng.integers(5)),
            ttl=float(rng.integers(1, 100)),
        )
        pool.get(f"k{rng.integers(40)}")
        assert pool.stats().used_bytes <= SLOTS * PAGE, i
    assert pool.check() == []


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_expired_entries_go_first_under_every_policy(small_pool, clock, policy):
    pool = small_pool(policy)
    for i in range(SLOTS):
        # k0 is the entry every policy would keep: newest access, most hits,
        # highest priority, latest expiry, smallest; but it expires first.
        pool.put(
            f"k{i}",
            b"v" * (10 if i == 0 else 900),
            priority=9 if i == 0 else 0,
            ttl=50 if i == 0 else 1000 - i,
        )
    for _ in range(5):
        pool.get("k0")
    clock.advance(60)
    pool.put("new", b"v")
    assert "k0" not in survivors(pool)
    assert len(pool) == SLOTS
    assert pool.stats().expirations == 1 and pool.stats().evictions == 0


def test_lru_evicts_the_least_recently_used(small_pool):
    pool = small_pool("lru")
    fill(pool)
    pool.get("k0")
    pool.get("k1")
    pool.put("new", b"v")
    pool.put("new2", b"v")
    assert survivors(pool) == {"k0", "k1", "k4", "k5", "k6", "k7", "new", "new2"}


def test_fifo_ignores_use(small_pool):
    pool = small_pool("fifo")
    fill(pool)
    pool.get("k0")
    pool.put("new", b"v")
    assert "k0" not in survivors(pool) and "k1" in survivors(pool)


def test_lfu_evicts_the_least_used_with_ties_by_recency(small_pool):
    pool = small_pool("lfu", lfu_half_life=10_000)  # no aging within this test
    fill(pool)
    for i in range(SLOTS):
        for _ in range(3 if i != 5 else 0):
            pool.get(f"k{i}")
    pool.put("new", b"v")
    assert "k5" not in survivors(pool)
    # "new" (one use) and k5's peers (four uses): the next victim is "new"
    pool.put("newer", b"v")
    assert "new" not in survivors(pool) and "newer" in survivors(pool)


def test_lfu_counts_age_so_old_popularity_fades(small_pool):
    pool = small_pool("lfu", lfu_half_life=4)
    fill(pool)
    for _ in range(10):
        pool.get("k0")  # popular long ago
    for _ in range(20):  # 60 ticks (15 half-lives) of other use
        for key in ("k1", "k2", "k3", "k4", "k5", "k6", "k7"):
            if _ % 3 == 0:
                pool.get(key)
    pool.put("new", b"v")
    assert "k0" not in survivors(pool)


def test_priority_evicts_lowest_first_then_least_recent(small_pool):
    pool = small_pool("priority")
    for i in range(SLOTS):
        pool.put(f"k{i}", b"v", priority=1 if i in (2, 6) else 5)
    pool.get("k2")  # k2 is more recent than k6: k6 goes first
    pool.put("new", b"v", priority=5)
    assert "k6" not in survivors(pool) and "k2" in survivors(pool)
    pool.put("new2", b"v", priority=5)
    assert "k2" not in survivors(pool)
    pool.put("new3", b"v", priority=5)  # all equal now: least recent (k0)
    assert "k0" not in survivors(pool)


def test_ttl_evicts_soonest_expiry_and_entries_without_ttl_last(small_pool):
    pool = small_pool("ttl")
    for i in range(SLOTS):
        pool.put(f"k{i}", b"v", ttl=None if i < 2 else 100 + (i * 37) % 50)
    soonest = min(range(2, SLOTS), key=lambda i: (i * 37) % 50)
    pool.put("new", b"v")
    assert f"k{soonest}" not in survivors(pool)
    for n in range(SLOTS - 3):  # evicts the five other entries with a ttl
        pool.put(f"more{n}", b"v")
    assert {"k0", "k1"} <= survivors(pool)
    assert not any(f"k{i}" in pool for i in range(2, SLOTS))


def test_size_evicts_the_largest(small_pool):
    pool = small_pool("size")
    for i in range(6):
        pool.put(f"k{i}", b"v" * (100 if i != 3 else 2500))  # k3 takes 3 pages
    pool.put("new", b"v" * 1500)
    assert "k3" not in survivors(pool) and len(pool) == 6


def test_s3fifo_evicts_entries_never_read_first_while_probation_is_over_its_share(small_pool):
    pool = small_pool("s3fifo")
    fill(pool)
    for i in (0, 1, 2, 3, 4, 5):
        pool.get(f"k{i}")  # k6, k7 still on probation: 2 of 8, over 10%
    pool.put("new", b"v")
    assert "k6" not in survivors(pool)  # the oldest on probation, though k0 is less recent
    pool.put("newer", b"v")  # probation: k7, new (2 of 8)
    assert "k7" not in survivors(pool) and "k0" in survivors(pool)
    pool.get("new")  # probation: newer alone, 1 of 8, still over 10%
    pool.put("last", b"v")
    assert "newer" not in survivors(pool)
    pool.get("last")  # none on probation: least recently used first
    pool.put("final", b"v")
    assert "k0" not in survivors(pool)


def test_s3fifo_recalls_keys_evicted_lately(small_pool):
    pool = small_pool("s3fifo")
    fill(pool, SLOTS + 1)  # k0 evicted, remembered
    pool.put("k0", b"v")  # recalled: not on probation
    assert pool.stats().evictions == 2
    assert pool._engine.views.entries["probation"][pool.locate("k0").eid] == 0


def test_a_key_stored_again_keeps_its_standing(small_pool):
    pool = small_pool("s3fifo")
    fill(pool)
    pool.get("k0")  # proven
    pool.put("k0", b"again")
    assert pool._engine.views.entries["probation"][pool.locate("k0").eid] == 0


def test_arc_balances_probation_by_what_its_evictions_cost(small_pool):
    pool = small_pool("arc")
    fill(pool)  # all in T1 (seen once); target 0: T1 gives way first
    pool.get("k7")  # in T2
    pool.put("a", b"v")
    assert "k0" not in survivors(pool)  # T1's least recent, though k7 is the only one in T2
    pool.put("k0", b"v")  # recalled from T1's ghosts: target 1, and k0 joins T2
    assert pool._engine.views.header_d[H.probation_target] == 1 and "k1" not in survivors(pool)
    for key in ("k2", "k3", "k4", "k5", "k6", "a"):
        pool.get(key)  # T1 empty, T2 all 8: T2 gives way
    pool.put("b", b"v")
    assert "k7" not in survivors(pool)  # T2's least recent
    pool.put("k7", b"v")  # recalled from T2's ghosts: target back to 0
    assert pool._engine.views.header_d[H.probation_target] == 0


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(InvalidArgument) as info:
        get_policy("mru")
    for name in ("lru", "lfu", "fifo", "priority", "ttl", "size"):
        assert name in str(info.value)


def test_sampled_lru_evicts_from_the_oldest_entries(make_pool):
    """With 4000 entries and 64 draws per victim, victims still come from the old end."""
    pool = make_pool(size=4000 * PAGE, page_size=PAGE, rng=np.random.default_rng(11))
    for i in range(4000):
        pool.put(f"k{i}", b"v")
    for i in range(400):
        pool.put(f"new{i}", b"v")
    evicted = [i for i in range(4000) if f"k{i}" not in pool]
    assert 400 <= len(evicted) < 400 + EVICTION_BATCH  # batches evict a little ahead
    assert np.percentile(evicted, 95) < 0.3 * 4000
    assert pool.check() == []


def test_explicit_evict_ranks_exactly_even_in_large_pools(make_pool):
    pool = make_pool(size=2000 * PAGE, page_size=PAGE, rng=np.random.default_rng(5))
    for i in range(2000):
        pool.put(f"k{i}", b"v")
    result = pool.evict(percent=10)
    assert result.num_entries == 200
    assert all(f"k{i}" not in pool for i in range(200))
    assert all(f"k{i}" in pool for i in range(200, 2000))


def test_policy_is_stored_in_the_pool(make_pool, pool_name):
    make_pool(policy="lfu")
    with kvcache.open(pool_name) as other:
        assert other.config.policy == "lfu"


@pytest.mark.parametrize("policy", ["size", "ttl"])
def test_regression_sampled_ties_are_broken_by_recency(make_pool, policy):
    """A partial sort once broke ties at the sample's cut arbitrarily: with every
    entry equal under the policy, sampled eviction must still act like LRU."""
    pool = make_pool(size=4000 * PAGE, page_size=PAGE, policy=policy, rng=np.random.default_rng(2))
    for i in range(4000):
        pool.put(f"k{i}", b"v")
    for i in range(400):
        pool.put(f"new{i}", b"v")
    evicted = [i for i in range(4000) if f"k{i}" not in pool]
    assert np.percentile(evicted, 95) < 0.3 * 4000
