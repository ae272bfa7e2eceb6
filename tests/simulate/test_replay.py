"""Replays: OPT against a naive model of MIN, every policy at or below OPT, the pool's
replay against plain models of LRU and the prefix policy (S3-FIFO and ARC: see
tests/test_exact_policies.py), and scratch pools that leave nothing behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from kvcache.errors import InvalidArgument
from kvcache.policies import POLICIES
from kvcache.simulate import (
    OPTIMAL,
    Trace,
    capacities_in_blocks,
    execute,
    policies_named,
    read_trace,
    replay_optimal,
    replay_pool,
    runs_for,
)
from kvcache.simulate.optimal import NEVER, next_uses

MOONCAKE_HEAD = Path(__file__).resolve().parents[1] / "data" / "mooncake-head-400.jsonl"


def trace_of(requests: list[list[int]], block_tokens: int = 4) -> Trace:
    starts = np.cumsum([0, *map(len, requests)])
    return Trace(
        "test",
        np.array([b for r in requests for b in r], dtype=np.uint64),
        starts.astype(np.int64),
        np.array([len(r) * block_tokens for r in requests], dtype=np.int64),
        np.zeros(len(requests)),
        block_tokens,
    )


@st.composite
def prompt_traffic(draw: st.DrawFn) -> list[list[int]]:
    """Requests that share prefixes: each takes a leading run of an earlier one and
    continues with blocks of its own (ids name whole prefixes, as in Mooncake's traces)."""
    requests: list[list[int]] = []
    fresh = 0
    for _ in range(draw(st.integers(1, 25))):
        shared: list[int] = []
        if requests and draw(st.booleans()):
            earlier = requests[draw(st.integers(0, len(requests) - 1))]
            shared = earlier[: draw(st.integers(0, len(earlier)))]
        own = draw(st.integers(0 if shared else 1, 6))
        requests.append([*shared, *range(fresh, fresh + own)])
        fresh += own
    return requests


def naive_min(requests: list[list[int]], capacity: int) -> int:
    """MIN written the slow, obvious way: on a miss with a full cache, scan ahead for the
    cached block needed last (or the new one: then it is not kept). Prefix hits."""
    reads = [b for r in requests for b in r]
    cache: set[int] = set()
    hits = position = 0

    def next_use(block: int) -> float:
        later = reads[position + 1 :]
        return later.index(block) if block in later else float("inf")

    for request in requests:
        leading = True
        for block in request:
            if block in cache:
                hits += leading
            else:
                leading = False
                if len(cache) < capacity:
                    cache.add(block)
                else:
                    victim = max(cache, key=next_use)
                    if next_use(victim) > next_use(block):
                        cache.remove(victim)
                        cache.add(block)
            position += 1
    return hits


def lru_model(requests: list[list[int]], capacity: int) -> tuple[int, int]:
    """Exact LRU with the pool's put semantics (room is made before a key is replaced, so a
    put of a present key into a full cache still evicts the least recent entry): prefix
    hits and evictions."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = evictions = 0
    for request in requests:
        reused = 0
        while reused < len(request) and request[reused] in cache:
            cache.move_to_end(request[reused])
            reused += 1
        for block in request[reused:]:
            if len(cache) >= capacity:
                cache.popitem(last=False)
                evictions += 1
            cache[block] = None
            cache.move_to_end(block)
        hits += reused
    return hits, evictions


def as_lists(trace: Trace) -> list[list[int]]:
    return [trace.request(i).tolist() for i in range(trace.num_requests)]


def test_next_uses_point_at_the_next_read_of_the_same_block():
    blocks = np.array([5, 6, 5, 7, 6, 5], dtype=np.uint64)
    assert next_uses(blocks).tolist() == [2, 4, 5, NEVER, NEVER, NEVER]


@settings(max_examples=150, deadline=None)
@given(prompt_traffic(), st.integers(1, 12))
def test_opt_reuses_exactly_what_min_does(requests, capacity):
    outcome = replay_optimal(trace_of(requests), capacity)
    assert outcome.block_hits == naive_min(requests, capacity)
    assert outcome.hit_tokens == outcome.block_hits * 4


@settings(max_examples=25, deadline=None)
@given(
    prompt_traffic(),
    st.integers(1, 12),
    st.sampled_from(["lru", "lfu", "fifo", "priority", "s3fifo", "arc", "prefix"]),
)
def test_no_policy_reuses_more_than_opt(requests, capacity, policy):
    trace = trace_of(requests)
    assert (
        replay_pool(trace, policy, capacity).block_hits
        <= replay_optimal(trace, capacity).block_hits
    )


@settings(max_examples=25, deadline=None)
@given(prompt_traffic(), st.integers(1, 12))
def test_the_pool_replay_of_exact_lru_is_the_lru_model(requests, capacity):
    outcome = replay_pool(trace_of(requests), "lru", capacity, eviction_samples=64)
    assert (outcome.block_hits, outcome.evictions) == lru_model(requests, capacity)


@pytest.fixture(scope="module")
def shared_trace() -> Trace:
    return read_trace(MOONCAKE_HEAD)


def test_on_the_mooncake_trace_the_pool_replay_is_the_lru_model(shared_trace):
    capacity = round(0.05 * shared_trace.num_distinct)
    outcome = replay_pool(shared_trace, "lru", capacity, eviction_samples=capacity)
    assert (outcome.block_hits, outcome.evictions) == lru_model(as_lists(shared_trace), capacity)
    assert outcome.block_hits > 0


def test_on_the_mooncake_trace_opt_is_the_ceiling_of_every_policy(shared_trace):
    capacities = capacities_in_blocks(shared_trace, ["1%", "5%", "20%"])
    outcomes = execute(shared_trace, runs_for(policies_named(["all"]), capacities), jobs=2)
    for capacity in capacities:
        here = [o for o in outcomes if o.capacity_blocks == capacity]
        ceiling = next(o for o in here if o.policy == OPTIMAL)
        assert len(here) == 1 + len(POLICIES)
        assert all(o.block_hits <= ceiling.block_hits for o in here)
        assert all(o.hit_tokens <= ceiling.hit_tokens for o in here if o.policy == "lru")


def test_runs_in_processes_give_what_runs_here_give(shared_trace):
    runs = runs_for(["lru", "fifo"], [50, 200])
    here, there = execute(shared_trace, runs, jobs=1), execute(shared_trace, runs, jobs=2)
    assert [(o.policy, o.block_hits, o.evictions) for o in here] == [
        (o.policy, o.block_hits, o.evictions) for o in there
    ]


@pytest.fixture
def own_shm_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A pool folder of the test's own, so that pools other test runs make are not seen."""
    folder = Path(tempfile.mkdtemp(prefix="kvcache-test-", dir="/dev/shm"))
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_scratch_pools_are_never_listed_and_leave_nothing(shared_trace, own_shm_dir):
    seen: list[tuple[list[str], list[str]]] = []

    def progress(done: int, total: int) -> None:
        seen.append((kvcache.list_pools(), os.listdir(own_shm_dir)))

    outcomes = execute(shared_trace, runs_for(["lru"], [100]), jobs=1, progress=progress)
    assert outcomes[1].evictions > 0  # the pool was used, and filled
    assert seen == [([], []), ([], [])]
    assert kvcache.list_pools() == [] and os.listdir(own_shm_dir) == []


def test_capacities_as_shares_counts_and_sizes(shared_trace):
    distinct = shared_trace.num_distinct
    assert capacities_in_blocks(shared_trace, ["10%", "1%", "1%", "300"]) == sorted(
        {round(distinct * 0.01), round(distinct * 0.10), 300}
    )
    assert capacities_in_blocks(shared_trace, [], ["1G", "256M"], block_bytes=64 << 20) == [4, 16]


@pytest.mark.parametrize("bad", ["0%", "101%", "-5", "0", "five", "%", ""])
def test_a_bad_capacity_says_what_to_give(shared_trace, bad):
    with pytest.raises(InvalidArgument, match="bad capacity"):
        capacities_in_blocks(shared_trace, [bad])


def test_a_size_below_one_block_says_so(shared_trace):
    with pytest.raises(InvalidArgument, match="holds no"):
        capacities_in_blocks(shared_trace, [], ["1M"], block_bytes=64 << 20)


def test_policies_by_name():
    assert policies_named(["all"]) == list(POLICIES)
    assert policies_named(["fifo", "lru", "opt"]) == ["lru", "fifo"]
    with pytest.raises(InvalidArgument, match="choose one of"):
        policies_named(["lru", "belady"])
