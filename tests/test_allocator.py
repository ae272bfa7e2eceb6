"""allocator: page chains, the free list and reservation, over a real pool's page links."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from kvcache import CorruptPoolError
from kvcache.allocator import RESERVE_GRANULE_BYTES, PageAllocator
from kvcache.layout import NO_PAGE, H
from kvcache.segment import segment_path

NUM_PAGES = 48


@contextlib.contextmanager
def fresh_pool(size: int | str = NUM_PAGES * 1024, **kwargs: object) -> Iterator[kvcache.Pool]:
    """A real pool for one hypothesis example (fixtures are per test, not per example)."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    pool = kvcache.create(name, size, page_size="1K", **kwargs)  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        pool.close()
        kvcache.destroy(name)


def _walk(pool: kvcache.Pool, first: int, num_pages: int) -> list[int]:
    nxt, chain, page = pool._engine.views.page_next_q, [], first
    for _ in range(num_pages):
        chain.append(page)
        page = nxt[page]
    return chain


def _free_list(pool: kvcache.Pool) -> list[int]:
    """The free list, walked without trusting it (bounded, range-checked)."""
    h, nxt = pool._engine.views.header_q, pool._engine.views.page_next_q
    pages, page = [], h[H.free_page_head]
    while page != NO_PAGE:
        assert 0 <= page < h[H.next_fresh_page], f"free list reaches page {page}"
        assert len(pages) < pool._engine.table.num_pages, "free list cycles"
        pages.append(page)
        page = nxt[page]
    return pages


def _check(pool: kvcache.Pool, chains: dict[int, tuple[int, int, int]]) -> None:
    """Every invariant of the allocator against the model: chain id -> (first, last, n)."""
    allocator, h = pool._engine.table.allocator, pool._engine.views.header_q
    num_pages = pool._engine.table.num_pages
    held: list[int] = []
    for first, last, n in chains.values():
        chain = _walk(pool, first, n)
        assert chain[-1] == last
        assert pool._engine.views.page_next_q[last] == NO_PAGE
        runs = allocator.runs(first, n)
        assert [p for start, count in runs for p in range(start, start + count)] == chain
        assert all(count >= 1 for _, count in runs)
        for (start, count), (next_start, _) in itertools.pairwise(runs):
            assert next_start != start + count, "adjacent runs were not coalesced"
        held.extend(chain)
    assert len(held) == len(set(held)), "two chains share a page"
    free = _free_list(pool)
    fresh = list(range(h[H.next_fresh_page], num_pages))
    assert len(free) == h[H.num_free_pages]
    assert sorted(held + free + fresh) == list(range(num_pages))
    assert allocator.num_available() == num_pages - len(held)
    assert h[H.used_pages] == len(held)
    assert h[H.next_fresh_page] <= h[H.reserved_pages] or not h[H.next_fresh_page]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 12)),
        st.tuples(st.just("free"), st.integers(0, 1000)),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(ops=OPS)
def test_allocator_against_a_model(ops: list[tuple[str, int]]) -> None:
    with fresh_pool() as pool:
        allocator = pool._engine.table.allocator
        chains: dict[int, tuple[int, int, int]] = {}
        for step, (op, n) in enumerate(ops):
            if op == "alloc":
                n = min(n, allocator.num_available())
                if not n:
                    continue
                first, last = allocator.allocate(n)
                chains[step] = (first, last, n)
            elif chains:
                key = sorted(chains)[n % len(chains)]
                allocator.free(*chains.pop(key))
            _check(pool, chains)
        for key in list(chains):  # everything back: all pages available again
            allocator.free(*chains.pop(key))
        _check(pool, chains)
        assert allocator.num_available() == NUM_PAGES


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 10), min_size=1, max_size=20), data=st.data())
def test_pages_of_a_pool_after_churn_pass_recovery(sizes: list[int], data: st.DataObject) -> None:
    """Through the pool: after puts and deletes of multi-page values, recovery finds
    nothing wrong and every value reads back."""
    with fresh_pool() as pool:
        stored: dict[str, bytes] = {}
        for i, pages in enumerate(sizes):
            key = f"k{i}"
            if stored and data.draw(st.booleans(), label="delete"):
                victim = data.draw(st.sampled_from(sorted(stored)), label="victim")
                assert pool.delete(victim)
                del stored[victim]
            value = bytes([i % 256]) * (pages * 1024 - len(key))  # exactly `pages` pages
            if pool._engine.table.allocator.num_available() >= pages:
                pool.put(key, value)
                stored[key] = value
        assert pool.check() == []
        for key, value in stored.items():
            assert pool.get(key) == value


def test_fresh_pool_gives_adjacent_pages(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    allocator = pool._engine.table.allocator
    assert allocator.allocate(5) == (0, 4)
    assert allocator.runs(0, 5) == [(0, 5)]
    assert allocator.allocate(1) == (5, 5)
    assert allocator.num_available() == NUM_PAGES - 6


def test_free_is_lifo_and_mixes_with_fresh_pages(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    allocator = pool._engine.table.allocator
    a = allocator.allocate(3)  # 0-2
    allocator.allocate(2)  # 3-4
    allocator.free(*a, 3)
    assert pool._engine.views.header_q[H.free_page_head] == 0
    first, last = allocator.allocate(5)  # the 3 freed pages, then 2 fresh ones
    assert _walk(pool, first, 5) == [0, 1, 2, 5, 6]
    assert last == 6
    assert allocator.runs(first, 5) == [(0, 3), (5, 2)]
    assert pool._engine.views.header_q[H.num_free_pages] == 0
    assert pool._engine.views.header_q[H.next_fresh_page] == 7


def test_allocate_every_page(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    allocator = pool._engine.table.allocator
    first, last = allocator.allocate(NUM_PAGES)
    assert (first, last) == (0, NUM_PAGES - 1)
    assert allocator.num_available() == 0
    allocator.free(first, last, NUM_PAGES)
    assert allocator.num_available() == NUM_PAGES
    assert allocator.allocate(NUM_PAGES) == (0, NUM_PAGES - 1)  # back from the free list


@pytest.mark.parametrize("bad_next", [NUM_PAGES, NUM_PAGES + 100, -5, 2**62])
def test_runs_refuses_chains_that_leave_the_pool(
    make_pool: Callable[..., kvcache.Pool], bad_next: int
) -> None:
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    first, _ = pool._engine.table.allocator.allocate(3)
    pool._engine.views.page_next_q[first + 1] = bad_next
    with pytest.raises(CorruptPoolError, match="leaves the pool"):
        pool._engine.table.allocator.runs(first, 3)
    with pytest.raises(CorruptPoolError):
        pool._engine.table.allocator.runs(NUM_PAGES, 1)
    with pytest.raises(CorruptPoolError):
        pool._engine.table.allocator.runs(first, 4)  # one page longer than the chain: ends at -1


def test_rebuild_from_owned_pages(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    allocator, h = pool._engine.table.allocator, pool._engine.views.header_q
    allocator.allocate(10)
    owned = np.zeros(NUM_PAGES, bool)
    owned[[1, 2, 7, 12]] = True  # 12 lies above the watermark: it is raised
    h[H.free_page_head] = 999  # garbage, replaced
    allocator.rebuild(owned)
    assert h[H.next_fresh_page] == 13
    assert h[H.used_pages] == 4
    assert sorted(_free_list(pool)) == [0, 3, 4, 5, 6, 8, 9, 10, 11]
    assert h[H.num_free_pages] == 9
    assert allocator.num_available() == NUM_PAGES - 4


def _file_bytes(pool: kvcache.Pool) -> int:
    return os.stat(segment_path(pool.name)).st_blocks * 512


def test_fresh_pages_are_reserved_a_granule_at_a_time(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    pool = make_pool("64M", page_size="64K")
    allocator, h = pool._engine.table.allocator, pool._engine.views.header_q
    granule = RESERVE_GRANULE_BYTES // (64 << 10)
    geometry = pool._engine.views.geometry
    # the metadata is backed at create, but for the ghost ring, which lru never writes
    metadata = geometry.data_offset - geometry.ghost_span[1]
    assert h[H.reserved_pages] == 0
    assert _file_bytes(pool) < metadata + granule * (64 << 10)
    allocator.allocate(1)
    assert h[H.reserved_pages] == granule
    assert _file_bytes(pool) >= metadata + granule * (64 << 10)
    allocator.allocate(granule)  # one page past the first granule: a second one
    assert h[H.reserved_pages] == 2 * granule
    first, last = allocator.allocate(3)
    allocator.free(first, last, 3)
    allocator.allocate(3)  # from the free list: nothing more to reserve
    assert h[H.reserved_pages] == 2 * granule
    allocator.allocate(allocator.num_available())
    assert h[H.reserved_pages] == pool._engine.table.num_pages
    assert _file_bytes(pool) >= geometry.total_bytes - geometry.ghost_span[1]


def test_reservation_failure_changes_nothing(make_pool: Callable[..., kvcache.Pool]) -> None:
    """If backing fresh pages fails, the allocator's state is untouched."""
    pool = make_pool(NUM_PAGES * 1024, page_size="1K")
    views = pool._engine.views

    def refuse(offset: int, length: int) -> None:
        raise kvcache.OutOfSharedMemoryError("full")

    allocator = PageAllocator(views, refuse)
    before = bytes(views.raw[: views.geometry.total_bytes])
    with pytest.raises(kvcache.OutOfSharedMemoryError):
        allocator.allocate(2)
    assert bytes(views.raw[: views.geometry.total_bytes]) == before
