"""The segment's queues (``kvcache.queues``): the ghost ring against a plain model, and the
bounds that keep its compaction O(1) amortised per put."""

from __future__ import annotations

import multiprocessing
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcache
from kvcache.layout import READY
from kvcache.policies import POLICIES
from kvcache.queues import MAIN, PROBATION

SLOTS = 16  # entry slots of the scratch pool: a ghost ring of 32 positions


@pytest.fixture
def small_pool(make_pool) -> Callable[[str], kvcache.Pool]:
    return lambda policy: make_pool(size=SLOTS * 1024, page_size=1024, policy=policy)


@pytest.fixture
def arc_pool(small_pool) -> kvcache.Pool:
    return small_pool("arc")


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "remove", "drop"]),
        st.integers(0, 40),
        st.sampled_from([True, True, True, False]),  # a rare kind's ghosts grow old
    ),
    min_size=50,
    max_size=400,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=operations)
def test_the_ghost_ring_forgets_nothing_it_should_remember(arc_pool, steps):
    """Adds, lookups and drops of the oldest against an ordered dict per kind, with at most
    half the ring's positions remembered (as the policies keep it): keys looked up out of
    order, and old ghosts of the kind that is not dropped, make the ring compact."""
    arc_pool._engine.table.queues.ghosts.clear()  # one pool for every example
    run_ghosts(arc_pool, steps)
    assert arc_pool.check() == []


def test_the_ghost_ring_compacts_in_order(arc_pool):
    """Long random runs (hypothesis's shrink toward few distinct keys, which rarely wrap the
    ring onto an old ghost): the ring compacts, and finds every ghost after."""
    rng = np.random.default_rng(5)
    ghosts = arc_pool._engine.table.queues.ghosts
    for _ in range(10):
        ghosts.clear()
        ops = rng.choice(["add", "add", "remove", "drop"], 300).tolist()
        numbers, probation = rng.integers(0, 41, 300).tolist(), (rng.random(300) < 0.75).tolist()
        steps = list(zip(ops, numbers, probation, strict=True))
        run_ghosts(arc_pool, steps)
    assert ghosts.num_compactions > 0
    assert arc_pool.check() == []


def run_ghosts(pool: kvcache.Pool, steps: list[tuple[str, int, bool]]) -> None:
    ring = pool._engine.table.queues.ghosts
    model: dict[int, OrderedDict[int, None]] = {PROBATION: OrderedDict(), MAIN: OrderedDict()}
    for op, number, probation in steps:
        kind = PROBATION if probation else MAIN
        lo = (number * 0x9E3779B97F4A7C15 % (1 << 64) - (1 << 63)) & ~3  # signed, as hashed
        if op == "add" and all(lo not in keys for keys in model.values()):
            if sum(map(len, model.values())) >= SLOTS:
                if not model[kind]:
                    continue
                ring.drop_oldest(kind)  # as the policies make room for a ghost
                model[kind].popitem(last=False)
            ring.add(lo, kind)
            model[kind][lo] = None
        elif op == "remove":
            expected = next((k for k, keys in model.items() if keys.pop(lo, 0) is None), -1)
            assert ring.remove(lo) == expected
        elif op == "drop":
            ring.drop_oldest(kind)
            if model[kind]:
                model[kind].popitem(last=False)
        assert (ring.count(PROBATION), ring.count(MAIN)) == tuple(map(len, model.values()))
    for kind, keys in model.items():
        for lo in keys:
            assert ring.remove(lo) == kind


@pytest.mark.parametrize("policy", ["arc", "s3fifo"])
def test_regression_ghosts_outnumbered_entries_of_many_pages_and_compacted_every_few_puts(
    make_pool, policy
):
    """ARC bounded its ghosts by the entry slots (pages): with 16-page values in a 64 MiB pool
    it held 19 ghosts per entry, so compacting the ring freed little and came every few
    hundred puts, a whole-ring loop under the lock each time (10-22 ms). Ghosts are now
    bounded by the live entries, and a compaction requeues at most one ghost per put
    on average."""
    pool = make_pool(size="4M", page_size="4K", policy=policy)  # 1,024 pages, 64 entries
    value = bytes(16 * 4096 - 512)
    keys = np.random.default_rng(1).zipf(1.2, 6000) % 20_000
    most = 0
    for number in keys.tolist():
        pool.put(number.to_bytes(8, "little"), value)
        ghosts = pool._engine.table.queues.ghosts
        most = max(most, ghosts.count(PROBATION) + ghosts.count(MAIN) - len(pool))
    assert most <= 4  # a key put again may evict before its old value goes: a ghost more
    assert ghosts.num_requeued <= len(keys)
    assert pool.check() == []


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_admit_leaves_no_note_in_the_reads_word(small_pool, policy):
    """The pool parks how to look up a new key's ghost in its entry's ``reads`` word until
    the entry is published; every policy starts a published entry with no note there."""
    pool = small_pool(policy)
    for number in range(60):
        pool.put(f"k{number % 23}", b"v" * 100)
        pool.get(f"k{(number * 7) % 23}")
    entries = pool._engine.views.entries
    reads = entries["reads"][entries["state"] == READY]
    assert reads.size and ((reads >= 0) & (reads <= 3)).all(), reads


def _put_into_damaged(name: str, errors: multiprocessing.Queue) -> None:
    with kvcache.open(name) as pool:
        try:
            pool.put("new", b"v" * 100)
        except kvcache.CorruptPoolError as exc:
            errors.put(str(exc))


def test_regression_a_damaged_read_count_spun_the_s3fifo_victim_loop_forever(make_pool):
    """A main entry's read count below zero never reaches zero: each reinsertion took one
    off and the victim loop went on, under the lock, for ever. Now the put reports damage.
    The put runs in a child, so that the old code fails here instead of hanging."""
    slots = 32  # probation's share is 3 entries: after the next put it holds fewer
    pool = make_pool(size=slots * 1024, page_size=1024, policy="s3fifo")
    for number in range(slots):
        pool.put(f"k{number}", b"v" * 100)
    for number in range(slots):
        pool.get(f"k{number}")
    pool.put("first", b"v" * 100)  # every key moves to main, read; main's oldest goes
    entries = pool._engine.views.entries
    entries["reads"][(entries["state"] == READY) & (entries["probation"] == MAIN)] = -1
    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    child = context.Process(target=_put_into_damaged, args=(pool.name, errors))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the put into a damaged pool did not return")
    assert "queue lists" in errors.get(timeout=10)
