"""The engine's ``s3fifo`` and ``arc`` against exact models of the papers, and ``prefix``
against its plain model.

The models (``tests/exact_policies.py``) are plain Python queues. The pool is
driven the way a prefix cache drives it: a request reads its blocks in order
until the first miss, then stores each block it does not hold and reads each
one it does (``PrefixCache.store`` skips chunks already cached). Hits and the
keys held at the end must be the same, step for step; on whole traces the hit
ratio of ``kvcache.simulate``'s replay must be within 0.3 points.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from exact_policies import MODELS, PrefixModel, replay
from kvcache.config import PoolConfig
from kvcache.layout import H
from kvcache.lifecycle import create_from_config, discard
from kvcache.simulate import read_trace, replay_pool
from kvcache.simulate.replay import KEY_BYTES, PAGE_BYTES, VALUE_BYTES

CLASSICS = ("s3fifo", "arc")
MOONCAKE_HEAD = Path(__file__).parent / "data" / "mooncake-head-400.jsonl"
GENERATOR = Path(__file__).parents[1] / "benchmarks" / "conversation_trace.py"


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """800 requests of the generator's ``chat`` shape (sessions come back sooner than in a
    Mooncake-length trace, so that a short trace has reuse)."""
    path = tmp_path_factory.mktemp("traces") / "chat.jsonl"
    run = [sys.executable, str(GENERATOR), "--shape", "chat", "--requests", "800"]
    with path.open("w") as out:
        subprocess.run([*run, "--seed", "5", "--turn-gap-median", "100"], stdout=out, check=True)
    return path


@contextmanager
def scratch_pool(policy: str, capacity: int) -> Iterator[kvcache.Pool]:
    """A hidden pool of ``capacity`` one-page entries (as ``simulate`` builds)."""
    config = PoolConfig.build(capacity * PAGE_BYTES, policy=policy, page_size=PAGE_BYTES)
    pool = create_from_config("exact", config, rng=np.random.default_rng(0), hidden=True)
    try:
        yield pool
    finally:
        pool.close()
        discard(pool)


def key(block: int) -> bytes:
    return block.to_bytes(KEY_BYTES, "little")


def drive(pools: list[kvcache.Pool], requests: list[list[int]]) -> int:
    """Prefix hits of ``requests`` through ``pools`` (handles of one pool, taking turns)."""
    value, buffer, hits = bytes(VALUE_BYTES), bytearray(VALUE_BYTES), 0
    for number, request in enumerate(requests):
        pool = pools[number % len(pools)]
        read = 0
        while read < len(request) and pool.get_into(key(request[read]), buffer):
            read += 1
        hits += read
        for block in request[read:]:
            if key(block) in pool:
                pool.get_into(key(block), buffer)
            else:
                pool.put(key(block), value)
    return hits


def held(pool: kvcache.Pool) -> set[int]:
    return {int.from_bytes(k, "little") for k in pool}


def model_run(policy: str, capacity: int, requests: list[list[int]]):
    model = MODELS[policy](capacity)
    hits = round(replay(model, requests) * sum(map(len, requests)))
    return hits, model


def model_keys(model) -> set[int]:
    if hasattr(model, "freq"):
        return set(model.freq)
    return set(model.t1) | set(model.t2)


random_accesses = st.lists(st.integers(0, 60), min_size=1, max_size=600).map(
    lambda blocks: [[b] for b in blocks]
)


@st.composite
def prompts(draw: st.DrawFn) -> list[list[int]]:
    """Requests that share prefixes: a leading run of an earlier one, then new blocks."""
    requests: list[list[int]] = []
    fresh = 0
    for _ in range(draw(st.integers(1, 60))):
        shared: list[int] = []
        if requests and draw(st.booleans()):
            earlier = requests[draw(st.integers(0, len(requests) - 1))]
            shared = earlier[: draw(st.integers(0, len(earlier)))]
        own = draw(st.integers(0 if shared else 1, 8))
        requests.append(shared + list(range(fresh, fresh + own)))
        fresh += own
    return requests


@pytest.mark.parametrize("policy", CLASSICS)
@settings(max_examples=100, deadline=None)
@given(requests=st.one_of(random_accesses, prompts()), capacity=st.integers(1, 40))
def test_the_pool_runs_each_classic_exactly(policy, requests, capacity):
    with scratch_pool(policy, capacity) as pool:
        hits = drive([pool], requests)
        expected_hits, model = model_run(policy, capacity, requests)
        assert hits == expected_hits
        assert held(pool) == model_keys(model)
        assert pool.check() == []


def drive_chunks(pool: kvcache.Pool, model: PrefixModel, requests: list[list[int]]) -> None:
    """Each request through the pool and the model as ``simulate`` replays it under
    ``prefix``: read up to the first miss, then store the rest, each block under the one
    before it. The hits must be the same, request by request."""
    value, buffer = bytes(VALUE_BYTES), bytearray(VALUE_BYTES)
    for request in requests:
        read = 0
        while read < len(request) and pool.get_into(key(request[read]), buffer):
            read += 1
        expected = 0
        while expected < len(request) and model.get(request[expected]):
            expected += 1
        assert read == expected
        for position in range(read, len(request)):
            parent = request[position - 1] if position else None
            pool.put(key(request[position]), value, parent=None if parent is None else key(parent))
            model.put(request[position], parent)


@settings(max_examples=150, deadline=None)
@given(requests=prompts(), capacity=st.integers(1, 40))
def test_the_pool_runs_prefix_as_its_model(requests, capacity):
    with scratch_pool("prefix", capacity) as pool:
        model = PrefixModel(capacity)
        drive_chunks(pool, model, requests)
        assert held(pool) == set(model.parent)
        assert pool.check() == []


@pytest.mark.parametrize("policy", CLASSICS)
def test_handles_taking_turns_share_one_policy(policy, make_pool):
    """The queues live in the segment: two handles (as two processes would) taking turns
    run one policy, the same as a single handle."""
    rng = np.random.default_rng(7)
    requests = [[int(b)] for b in rng.zipf(1.3, 3000) % 400]
    expected_hits, model = model_run(policy, 50, requests)
    pool = make_pool(50 * PAGE_BYTES, policy=policy, page_size=PAGE_BYTES)
    with kvcache.open(pool.name) as other:
        assert drive([pool, other], requests) == expected_hits
    assert held(pool) == model_keys(model)


def _drive_in_child(name: str, requests: list[list[int]], hits: multiprocessing.Queue) -> None:
    with kvcache.open(name) as pool:
        hits.put(drive([pool], requests))


@pytest.mark.parametrize("policy", CLASSICS)
def test_another_process_goes_on_where_this_one_stopped(policy, make_pool):
    """A second process continues the same traffic on the queues this one left: together
    they make the exact model's decisions."""
    rng = np.random.default_rng(11)
    requests = [[int(b)] for b in rng.zipf(1.3, 2000) % 300]
    expected_hits, model = model_run(policy, 40, requests)
    pool = make_pool(40 * PAGE_BYTES, policy=policy, page_size=PAGE_BYTES)
    first = drive([pool], requests[:1000])
    context = multiprocessing.get_context("spawn")
    hits = context.Queue()
    child = context.Process(target=_drive_in_child, args=(pool.name, requests[1000:], hits))
    child.start()
    second = hits.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    assert first + second == expected_hits
    assert held(pool) == model_keys(model)


@pytest.mark.parametrize("policy", CLASSICS)
def test_repair_requeues_every_entry(policy):
    rng = np.random.default_rng(3)
    requests = [[int(b)] for b in rng.zipf(1.3, 500) % 100]
    with scratch_pool(policy, 30) as pool:
        drive([pool], requests)
        before = held(pool)
        pool._engine.views.header_q[H.main_tail] = 0  # as if a process died mid-move
        assert pool.check() != []
        pool.check(repair=True)
        assert pool.check() == [] and held(pool) == before
        drive([pool], requests)  # and it goes on evicting
        assert len(pool) == 30


@pytest.mark.parametrize("policy", CLASSICS)
@pytest.mark.parametrize("which", ["mooncake", "chat"])
def test_simulate_replays_within_0_3_points_of_the_exact_model(policy, which, chat_trace):
    trace = read_trace(MOONCAKE_HEAD if which == "mooncake" else chat_trace)
    requests = [trace.request(i).tolist() for i in range(trace.num_requests)]
    for share in (0.01, 0.05, 0.2):
        capacity = max(8, round(trace.num_distinct * share))
        outcome = replay_pool(trace, policy, capacity)
        exact = replay(MODELS[policy](capacity), requests)
        assert abs(outcome.hit_ratio - exact) <= 0.003, (share, outcome.hit_ratio, exact)


@pytest.mark.parametrize("which", ["mooncake", "chat"])
def test_simulate_replays_prefix_within_0_3_points_of_its_model(which, chat_trace):
    """The pool takes its capacity as its live entries, which an eviction of a whole chain
    leaves below the slots for a while; the model keeps a fixed capacity."""
    trace = read_trace(MOONCAKE_HEAD if which == "mooncake" else chat_trace)
    requests = [trace.request(i).tolist() for i in range(trace.num_requests)]
    for share in (0.01, 0.05, 0.2):
        capacity = max(8, round(trace.num_distinct * share))
        outcome = replay_pool(trace, "prefix", capacity)
        model = replay(PrefixModel(capacity), requests)
        assert abs(outcome.hit_ratio - model) <= 0.003, (share, outcome.hit_ratio, model)
