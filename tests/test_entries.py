"""entries: slot claim/release and the dense live list, over a real pool's entry table."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from kvcache.entries import EntryTable
from kvcache.layout import ENTRY_WORDS, FREE, READY, WRITING, E, H, Views


@contextlib.contextmanager
def fresh_pool(**kwargs: object) -> Iterator[kvcache.Pool]:
    """A real, tiny pool for one hypothesis example (fixtures are per test, not per example)."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    pool = kvcache.create(name, "16K", page_size="1K", **kwargs)  # type: ignore[arg-type]
    try:
        yield pool
    finally:
        pool.close()
        kvcache.destroy(name)


@pytest.fixture
def table4(make_pool: Callable[..., kvcache.Pool]) -> tuple[EntryTable, Views]:
    pool = make_pool("16K", page_size="1K", max_entries=4)
    return pool._engine.table.entries, pool._engine.views


def _gen(views: Views, eid: int) -> int:
    return views.entries_q[eid * ENTRY_WORDS + E.generation]


def _live(views: Views) -> list[int]:
    return views.live[: views.header_q[H.num_live]].tolist()


def test_claim_hands_out_fresh_slots_in_order(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    assert [entries.claim() for _ in range(4)] == [0, 1, 2, 3]
    assert views.header_q[H.next_fresh_entry] == 4
    assert [_gen(views, eid) for eid in range(4)] == [1, 1, 1, 1]


def test_table_full(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    for _ in range(4):
        assert entries.has_free_slot()
        assert entries.claim() >= 0
    assert not entries.has_free_slot()
    assert entries.claim() == -1
    assert entries.claim() == -1  # and nothing changed
    assert views.header_q[H.next_fresh_entry] == 4
    assert views.header_q[H.free_entry_head] == 0
    entries.release(2)
    assert entries.has_free_slot()
    assert entries.claim() == 2
    assert not entries.has_free_slot()


def test_released_slots_are_reused_last_in_first_out(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    for _ in range(3):
        entries.claim()
    entries.release(0)
    entries.release(2)
    assert views.entries_q[2 * ENTRY_WORDS + E.state] == FREE
    assert entries.claim() == 2
    assert entries.claim() == 0
    assert entries.claim() == 3  # free chain empty: back to fresh slots
    assert entries.claim() == -1


def test_generation_changes_on_claim_and_release(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    eid = entries.claim()
    views.entries_q[eid * ENTRY_WORDS + E.state] = READY
    before = _gen(views, eid)
    entries.release(eid)
    assert _gen(views, eid) == before + 1
    assert views.entries_q[eid * ENTRY_WORDS + E.state] == FREE
    assert entries.claim() == eid
    assert _gen(views, eid) == before + 2  # a reader holding `before` notices both


def test_live_list_append_and_swap_with_last(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    ids = [entries.claim() for _ in range(4)]
    for eid in ids:
        entries.add_live(eid)
    assert _live(views) == [0, 1, 2, 3]
    assert [views.entries_q[e * ENTRY_WORDS + E.live_pos] for e in ids] == [0, 1, 2, 3]
    entries.remove_live(1)  # the last (3) moves into its place
    assert _live(views) == [0, 3, 2]
    assert views.entries_q[3 * ENTRY_WORDS + E.live_pos] == 1
    entries.remove_live(2)  # removing the last moves nothing else
    assert _live(views) == [0, 3]
    entries.remove_live(0)
    assert _live(views) == [3]
    assert views.entries_q[3 * ENTRY_WORDS + E.live_pos] == 0
    entries.remove_live(3)
    assert _live(views) == []
    entries.add_live(2)
    assert _live(views) == [2]


def test_live_ids_is_a_copy(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    for _ in range(2):
        entries.add_live(entries.claim())
    ids = entries.live_ids()
    ids[0] = 99
    assert _live(views) == [0, 1]
    assert entries.live_ids().dtype == np.int64


def test_rebuild_from_records(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    for _ in range(4):
        entries.claim()
    records = views.entries
    records["state"][:4] = [READY, WRITING, READY, READY]
    views.header_q[H.num_live] = 0  # live list lost
    generations = records["generation"][:4].copy()
    keep = np.array([True, True, False, True])
    entries.rebuild(keep)
    assert records["state"][2] == FREE
    assert records["generation"][2] == generations[2] + 1
    assert (records["generation"][[0, 1, 3]] == generations[[0, 1, 3]]).all()
    assert _live(views) == [0, 3]  # READY entries kept; WRITING ones are not live
    assert records["live_pos"][0] == 0 and records["live_pos"][3] == 1
    assert entries.claim() == 2
    assert entries.claim() == -1


def test_rebuild_chains_every_dropped_slot(table4: tuple[EntryTable, Views]) -> None:
    entries, views = table4
    for _ in range(3):
        entries.claim()
    views.entries["state"][:3] = READY
    entries.rebuild(np.zeros(4, bool))
    assert _live(views) == []
    assert sorted(entries.claim() for _ in range(4)) == [0, 1, 2, 3]
    assert entries.claim() == -1


OPS = st.lists(
    st.tuples(st.sampled_from(["claim", "release", "live", "unlive"]), st.integers(0, 1000)),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_entry_table_against_a_model(ops: list[tuple[str, int]]) -> None:
    max_entries = 8
    with fresh_pool(max_entries=max_entries) as pool:
        entries, views = pool._engine.table.entries, pool._engine.views
        claimed: set[int] = set()
        live: list[int] = []  # the model keeps the swap-with-last order too
        for op, n in ops:
            if op == "claim":
                eid = entries.claim()
                if len(claimed) == max_entries:
                    assert eid == -1
                else:
                    assert 0 <= eid < max_entries and eid not in claimed
                    claimed.add(eid)
            elif op == "release" and claimed - set(live):
                eid = sorted(claimed - set(live))[n % len(claimed - set(live))]
                entries.release(eid)
                claimed.remove(eid)
            elif op == "live" and claimed - set(live):
                eid = sorted(claimed - set(live))[n % len(claimed - set(live))]
                entries.add_live(eid)
                live.append(eid)
            elif op == "unlive" and live:
                eid = live[n % len(live)]
                entries.remove_live(eid)
                pos = live.index(eid)
                live[pos] = live[-1]
                live.pop()
            assert entries.has_free_slot() == (len(claimed) < max_entries)
            assert _live(views) == live
            for pos, eid in enumerate(live):
                assert views.entries_q[eid * ENTRY_WORDS + E.live_pos] == pos
            # free chain + fresh slots are exactly the unclaimed ids
            free, head = [], views.header_q[H.free_entry_head]
            while head and len(free) <= max_entries:
                free.append(head - 1)
                head = views.entries_q[(head - 1) * ENTRY_WORDS + E.next_free]
            fresh = range(views.header_q[H.next_fresh_entry], max_entries)
            assert sorted([*free, *fresh]) == sorted(set(range(max_entries)) - claimed)
