"""The frequency sketch (``kvcache.sketch``): counts in 4-bit counters of the ghost region,
capped, halved, and never mistaken for ghosts. No policy keeps one at present; it is
built here over the ghost region of a pool whose policy leaves the region unused."""

from __future__ import annotations

import pytest

from kvcache.keys import key_hash
from kvcache.layout import H
from kvcache.sketch import AGING_ADDITIONS_PER_SLOT, COUNT_LIMIT, FrequencySketch, admits

PAGE = 1024


@pytest.fixture
def sketch_pool(make_pool):
    pool = make_pool(size=64 * PAGE, page_size=PAGE, policy="lru")
    pool._engine.table.sketch = FrequencySketch(pool._engine.views)
    return pool


def test_counts_grow_by_one_up_to_the_limit(sketch_pool):
    sketch = sketch_pool._engine.table.sketch
    k = key_hash(b"k")
    assert sketch.estimate(*k) == 0
    assert [sketch.add(*k) for _ in range(COUNT_LIMIT + 3)] == [
        *range(1, COUNT_LIMIT + 1),
        COUNT_LIMIT,
        COUNT_LIMIT,
        COUNT_LIMIT,
    ]
    assert sketch.estimate(*key_hash(b"other")) == 0  # no counter of "k" carried into a neighbour


def test_counts_halve_after_the_window(sketch_pool):
    sketch = sketch_pool._engine.table.sketch
    k = key_hash(b"k")
    for _ in range(12):
        sketch.add(*k)
    window = AGING_ADDITIONS_PER_SLOT * len(sketch_pool._engine.views.ghost_uq)
    for i in range(window - 12 - 1):
        sketch.add(*key_hash(f"filler{i}".encode()))
    assert (
        sketch.estimate(*k) == 12
        and sketch_pool._engine.views.header_q[H.sketch_additions] == window - 1
    )
    sketch.add(*key_hash(b"last"))
    assert sketch.estimate(*k) == 6 and sketch_pool._engine.views.header_q[H.sketch_additions] == 0


def test_only_a_key_asked_for_more_often_than_the_victim_is_used_gets_in():
    assert admits(2, 1.5) and not admits(1, 1.0) and admits(1, 0.4)


def test_other_probation_policies_keep_ghosts_in_the_region(make_pool):
    pool = make_pool(size=8 * PAGE, page_size=PAGE, policy="s3fifo")
    for i in range(9):
        pool.put(f"k{i}", b"v")
    assert (
        pool._engine.table.sketch is None
        and pool._engine.views.header_q[H.num_ghosts_probation] == 1
    )
    assert pool.check() == []


def test_a_restored_count_is_raised_to_the_entry_count_never_lowered(sketch_pool):
    sketch = sketch_pool._engine.table.sketch
    k = key_hash(b"k")
    sketch.raise_to(*k, 5.2)
    assert sketch.estimate(*k) == 5
    sketch.raise_to(*k, 2.0)
    sketch.raise_to(*key_hash(b"huge"), 1e9)
    assert sketch.estimate(*k) == 5 and sketch.estimate(*key_hash(b"huge")) == COUNT_LIMIT
