"""Chains of pools: spill on eviction, promotion on a hit below, chain-wide mapping operations."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import kvcache
from kvcache import tiers
from kvcache.layout import H

PAGE = 4096
VALUE = 3000  # one page each with its key


def value_of(i: int) -> bytes:
    return i.to_bytes(4, "little") * (VALUE // 4)


@pytest.fixture(params=["cpu", "disk"])
def chain(request, names, disk) -> Iterator[Callable[..., list[kvcache.Pool]]]:
    """``chain(sizes..., promote=...)``: pools top first, each spilling to the next; the
    bottom one in shared memory, then (the same tests again) a disk pool in a disk folder."""
    opened: list[kvcache.Pool] = []
    bottom = {"tier": request.param, "path": disk} if request.param == "disk" else {}

    def make(*sizes: str, promote: str = "hit", **kwargs: object) -> list[kvcache.Pool]:
        pools: list[kvcache.Pool] = []
        lower = None
        for size in reversed(sizes):
            where = {} if lower else bottom
            pool = kvcache.create(
                names(), size, page_size=PAGE, spill_to=lower, promote=promote, **where, **kwargs
            )
            pools.insert(0, pool)
            lower = pool.name
        opened.extend(pools)
        return pools

    yield make
    for pool in opened:
        pool.close()


def here(pool: kvcache.Pool) -> set:
    """The keys of this pool alone (``keys()`` sees the whole chain)."""
    return {entry.key for entry in pool.entries()}


def fill(pool: kvcache.Pool, count: int, prefix: str = "k") -> None:
    for i in range(count):
        pool.put(f"{prefix}{i}", value_of(i))


def test_evicted_entries_spill_down_with_ttl_and_priority(chain) -> None:
    top, bottom = chain("256K", "1M")
    top.put("marked", b"m" * VALUE, priority=-5, ttl=3600)  # the policy's first victim
    fill(top, 100)
    stats = top.stats()
    assert stats.spills > 0 and stats.num_entries <= 64
    assert stats.evictions == 0  # all moved, none dropped
    assert bottom.stats().num_entries == stats.spills
    info = {e.key: e for e in bottom.entries()}["marked"]
    assert info.priority == -5
    assert 3500 < bottom.ttl("marked") <= 3600


def test_a_miss_above_that_hits_below_is_returned_and_promoted(chain) -> None:
    top, bottom = chain("256K", "1M")
    fill(top, 100)
    spilled = [k for k in bottom]
    key = spilled[0]
    i = int(key[1:])
    assert top.get(key) == value_of(i)
    assert key not in here(bottom)  # moved up, not copied
    assert key in here(top) and top.stats().promotions == 1
    assert top.check() == [] and bottom.check() == []


def test_every_value_is_found_across_the_chain_and_stays_correct(chain) -> None:
    top, middle, bottom = chain("128K", "256K", "2M")
    fill(top, 300)
    assert middle.stats().spills > 0  # the middle pool spilled on to the bottom one
    for _ in range(2):  # the second round reads what the first promoted and spilled again
        for i in np.random.default_rng(1).permutation(300).tolist():
            assert top.get(f"k{i}") == value_of(i), i
    for pool in (top, middle, bottom):
        assert pool.check() == []


def test_promote_never_reads_below_and_leaves_the_entry_there(chain) -> None:
    top, bottom = chain("256K", "1M", promote="never")
    fill(top, 100)
    key = bottom.keys()[0]
    assert top.get(key) is not None
    assert key in here(bottom) and key not in here(top)
    assert top.stats().promotions == 0


def test_get_into_reads_through_the_chain(chain) -> None:
    top, bottom = chain("256K", "1M")
    fill(top, 100)
    key = bottom.keys()[0]
    buffer = bytearray(VALUE)
    assert top.get_into(key, buffer) == VALUE
    assert bytes(buffer) == value_of(int(key[1:]))


def test_membership_keys_and_len_see_the_whole_chain(chain) -> None:
    top, _bottom = chain("256K", "1M")
    fill(top, 100)
    assert len(top) == 100 == len(set(top.keys()))
    assert all(f"k{i}" in top for i in range(100))
    assert top.stats().num_entries < 100  # stats stay this pool's own


def test_a_put_clears_the_key_below_so_an_old_value_never_resurfaces(chain) -> None:
    top, bottom = chain("256K", "1M")
    fill(top, 100)
    key = bottom.keys()[0]
    top.put(key, b"new")
    assert key not in bottom
    top.evict(percent=100)  # drops (evict acts on the named pool): the new value goes
    assert top.get(key) is None  # and the old one does not come back from below


def test_delete_pop_touch_ttl_and_clear_act_on_every_tier(chain) -> None:
    top, bottom = chain("256K", "1M")
    fill(top, 100)
    below = bottom.keys()
    assert top.delete(below[0]) and below[0] not in top
    assert not top.delete(below[0])
    assert top.pop(below[1]) == value_of(int(below[1][1:])) and below[1] not in top
    assert top.touch(below[2], ttl=50) and 0 < top.ttl(below[2]) <= 50
    with pytest.raises(KeyError):
        top.ttl("absent")
    assert top.clear() == 98
    assert len(top) == 0 and len(bottom) == 0


def test_expired_entries_are_dropped_not_spilled(chain, clock) -> None:
    top, bottom = chain("256K", "1M", clock=clock)
    for i in range(60):
        top.put(f"old{i}", value_of(i), ttl=10)
    clock.advance(11)
    fill(top, 60)
    assert not any(k.startswith("old") for k in bottom)
    assert top.stats().expirations > 0


def test_a_promotion_never_overwrites_a_newer_put() -> None:
    """``write_entry(replace=False)``, which promotions use, keeps the entry already there."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    with kvcache.create(name, "1M", page_size=PAGE) as pool:
        try:
            pool.put("k", b"old")
            ref = pool.locate("k")
            entry, _views = pool.read_entry(ref)
            pool.put("k", b"newer")
            written = pool.write_entry(
                entry,
                lambda targets: (targets[0].__setitem__(slice(0, 4), b"kold"), entry.checksum)[1],
                replace=False,
            )
            assert not written and pool.get("k") == b"newer"
            assert pool.check() == []
        finally:
            kvcache.destroy(name)


def test_a_damaged_entry_below_is_never_promoted_or_served(chain) -> None:
    top, bottom = chain("256K", "1M", verify_reads=True)
    fill(top, 100)
    key = bottom.keys()[0]
    ref = bottom.locate(key)
    _, views = bottom.read_entry(ref)
    views[-1][-1] ^= 0xFF  # flip a byte of the payload, in place
    assert top.get(key) is None
    assert key not in top and key not in here(bottom)
    assert bottom.stats().damaged == 1


def test_chain_is_stored_in_the_pool_and_followed_by_every_opener(chain) -> None:
    top, bottom = chain("256K", "1M")
    with kvcache.open(top.name) as again:
        assert again.spill_to == bottom.name and again.lower is not None
        fill(again, 100)
        assert bottom.stats().num_entries > 0
        assert [p.name for p in again.chain()] == [top.name, bottom.name]


def test_create_refuses_a_missing_lower_pool_itself_and_cycles(names) -> None:
    a, b = names(), names()
    with pytest.raises(kvcache.PoolNotFoundError, match="create it first"):
        kvcache.create(a, "1M", spill_to=b)
    with pytest.raises(kvcache.InvalidArgument, match="itself"):
        kvcache.create(a, "1M", spill_to=a)
    with pytest.raises(kvcache.InvalidArgument, match="not allowed"):
        kvcache.create(a, "1M", spill_to="../etc")
    with pytest.raises(kvcache.InvalidArgument, match="promote"):
        kvcache.create(a, "1M", promote="sometimes")
    assert a not in kvcache.list_pools()
    kvcache.create(b, "1M").close()
    kvcache.create(a, "1M", spill_to=b).close()
    kvcache.destroy(b, force=True)  # a now names a missing b
    with pytest.raises(kvcache.InvalidArgument, match="cycle"):
        kvcache.create(b, "1M", spill_to=a)
    assert b not in kvcache.list_pools()


def test_destroying_a_lower_pool_is_refused_unless_forced(chain) -> None:
    top, bottom = chain("256K", "1M")
    with pytest.raises(kvcache.PoolBusyError, match="spill to"):
        kvcache.destroy(bottom.name)
    assert bottom.name in kvcache.list_pools()
    bottom.close()
    kvcache.destroy(bottom.name, force=True)
    fill(top, 100)  # the chain is cut: evictions drop, nothing fails
    assert top.stats().evictions > 0 and top.get("k0") is None
    assert top.check() == []


def test_an_upper_pool_works_alone_while_its_lower_pool_is_missing(chain, monkeypatch) -> None:
    top, bottom = chain("256K", "1M")
    name, lower = top.name, bottom.name
    bottom.close()
    top.close()
    kvcache.destroy(lower, force=True)
    with kvcache.open(name) as alone:
        assert alone.spill_to == lower and alone.lower is None
        fill(alone, 100)
        assert alone.get("k99") == value_of(99) and alone.stats().spills == 0
        monkeypatch.setattr(tiers, "REOPEN_INTERVAL_S", 0.0)
        kvcache.create(lower, "1M", page_size=PAGE).close()  # back: the chain is followed again
        alone._chain.below._retry_at = 0.0  # white-box: skip the wait rather than sleep
        fill(alone, 100, prefix="again")
        assert alone.stats().spills > 0


def test_spill_counters_survive_repair(chain) -> None:
    top, _bottom = chain("256K", "1M")
    fill(top, 100)
    spills = top.stats().spills
    top._engine.views.header_q[H.dirty] = (
        1  # as if a holder died mid-mutation: the next lock holder repairs
    )
    assert top.stats().spills == spills and top.stats().repairs == 1


def test_a_restore_that_replaces_a_pool_keeps_its_chain(chain, tmp_path) -> None:
    top, bottom = chain("256K", "1M", promote="never")
    fill(top, 100)
    snapshot = kvcache.persist(top, tmp_path / "top.kvsnap")
    name = top.name
    top.close()
    with kvcache.restore(name, snapshot, replace=True) as again:
        assert again.spill_to == bottom.name and again.promote == "never"
        assert again.get("k0") == value_of(0)  # still below, read through the kept chain
        assert again.stats().promotions == 0


@pytest.mark.parametrize("promote", ["hit", "never"])
def test_each_tier_counts_one_lookup_per_read(chain, promote) -> None:
    top, middle, bottom = chain("128K", "256K", "2M", promote=promote)
    fill(top, 300)
    key = next(k for k in bottom if k not in here(middle))
    before = [(p.stats().hits, p.stats().misses) for p in (top, middle, bottom)]
    assert top.get("absent") is None
    assert top.get(key) == value_of(int(key[1:]))
    after = [(p.stats().hits, p.stats().misses) for p in (top, middle, bottom)]
    deltas = [(h1 - h0, m1 - m0) for (h0, m0), (h1, m1) in zip(before, after, strict=True)]
    assert deltas == [(0, 2), (0, 2), (1, 1)]
