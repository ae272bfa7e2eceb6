"""Eviction regret (``kvcache.regret``): the histograms against a trace computed by hand,
the sample's bounds, and what the metrics and ``simulate`` report of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import kvcache
from kvcache import regret
from kvcache.regret import NUM_RECORDS, sample_shift
from kvcache.simulate import read_trace, replay_pool

PAGE = 1024


@pytest.fixture
def lru4(make_pool: Callable[..., kvcache.Pool], clock) -> kvcache.Pool:
    """Four one-page entries under LRU, every eviction sampled, a clock moved by hand."""
    return make_pool(size=4 * PAGE, page_size=PAGE, policy="lru", clock=clock)


def test_the_histograms_match_a_trace_computed_by_hand(lru4, clock):
    """One second per step; the pool's accesses (its clock) tick on each put and hit.

    step  op      clock  evicts (when, clock)
    0-3   put abcd  1-4
    4     put e     5    a (4 s, 4)
    5     get b     6
    6     put f     7    c (6 s, 6): LRU order c d e b
    7     get a     -    miss: a back 3 s and 7 - 4 = 3 accesses after its eviction
    8     put a     8    d (8 s, 7); not a second regret of a
    9     get c     -    miss: c back 3 s and 8 - 6 = 2 accesses after
    10    get z     -    miss of a key never evicted: nothing
    """
    steps = [
        ("put", "a"), ("put", "b"), ("put", "c"), ("put", "d"), ("put", "e"),
        ("get", "b"), ("put", "f"), ("get", "a"), ("put", "a"), ("get", "c"), ("get", "z"),
    ]  # fmt: skip
    for op, key in steps:
        lru4.put(key, b"v") if op == "put" else lru4.get(key)
        clock.advance(1)
    r = lru4.metrics().regret
    assert r is not None and r.sampled_one_in == 1
    seconds = [0] * (len(regret.SECONDS_BOUNDS) + 1)
    seconds[regret.SECONDS_BOUNDS.index(4.0)] = 2  # 3 s and 3 s: both <= 4 s
    assert list(r.seconds.counts) == seconds and r.seconds.sum == 6.0
    accesses = [0] * (len(regret.ACCESS_BOUNDS) + 1)
    accesses[regret.ACCESS_BOUNDS.index(2.0)] = 1  # c: 2
    accesses[regret.ACCESS_BOUNDS.index(4.0)] = 1  # a: 3
    assert list(r.accesses.counts) == accesses and r.accesses.sum == 5
    assert r.unrequested == 0  # d is still in the sample
    assert r.share_asked_again == 1.0 and r.accesses.quantile(0.5) == 2.0


def test_keys_pushed_out_of_the_sample_count_as_unrequested(lru4):
    for number in range(NUM_RECORDS + 6):
        lru4.put(f"k{number}", b"v")  # evicts NUM_RECORDS + 2 keys, none asked for again
    assert lru4.get("k0") is None  # pushed out already: no regret
    assert lru4.get("k5") is None  # still in the sample
    r = lru4.metrics().regret
    assert r is not None
    assert r.unrequested == 2 and r.seconds.count == 1
    lru4.reset_stats()
    r = lru4.metrics().regret
    assert r is not None and r.unrequested == 0 and r.seconds.count == r.accesses.count == 0


def test_an_evicted_chunk_takes_the_chunks_below_it_into_the_sample(make_pool):
    pool = make_pool(size=8 * PAGE, page_size=PAGE, policy="prefix")
    pool.put("a", b"v")
    pool.put("b", b"v", parent="a")
    pool.put("c", b"v", parent="b")
    pool.evict(percent=100)
    pool.put("a", b"v")  # asked for again: a put of a key the pool does not hold
    pool.put("b", b"v", parent="a")
    assert pool.get("c") is None
    r = pool.metrics().regret
    assert r is not None and r.seconds.count == 3


def test_the_sample_spans_about_twice_the_entry_slots_in_evictions():
    for max_entries in (1, 32, 1000, 4096, 1 << 20):
        span = NUM_RECORDS << sample_shift(max_entries)
        assert span >= 2 * max_entries and (span < 4 * max_entries or span == NUM_RECORDS)


def test_the_metrics_export_both_histograms(lru4, clock):
    from kvcache import metrics

    pytest.importorskip("prometheus_client")
    for key in "abcde":
        lru4.put(key, b"v")
    clock.advance(0.5)
    lru4.get("a")
    text = metrics.exposition(pools=[lru4.name])
    label = f'pool="{lru4.name}",tier="cpu"'
    assert f'kvcache_eviction_regret_seconds_bucket{{le="0.5",{label}}} 1.0' in text
    assert f'kvcache_eviction_regret_seconds_bucket{{le="0.25",{label}}} 0.0' in text
    assert f'kvcache_eviction_regret_accesses_bucket{{le="1",{label}}} 1.0' in text
    assert f"kvcache_eviction_regret_unrequested_total{{{label}}} 0.0" in text
    assert f"kvcache_eviction_regret_sampled_one_in{{{label}}} 1.0" in text


def test_simulate_reports_regret_in_the_traces_time(tmp_path):
    """Four blocks, capacity two under LRU: block 1 is evicted at 2 s and asked for at 3 s,
    two puts after (blocks 3 and 4 of the request before)."""
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"timestamp": 1000, "hash_ids": [1, 2]}\n'
        '{"timestamp": 2000, "hash_ids": [3, 4]}\n'
        '{"timestamp": 3000, "hash_ids": [1]}\n'
    )
    outcome = replay_pool(read_trace(path), "lru", 2)
    summary = outcome.regret_summary()
    assert summary is not None
    assert summary["asked_again"] == 1 and summary["p50_seconds"] == 1.0
    assert summary["p50_accesses"] == 2.0
    assert outcome.as_dict()["regret"] == summary
