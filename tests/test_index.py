"""index: open addressing with backward-shift deletion, over a real pool's key index.

The index reads each entry's hash from the entry table, so tests write ``hash_lo`` and
``hash_hi`` into real entry records and choose ``hash_lo`` values that share home
slots and wrap around the end of the table.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from kvcache.index import HashIndex
from kvcache.layout import ENTRY_WORDS, E, Views

MAX_ENTRIES = 16
SLOTS = 32  # the index of 16 entries: twice as many slots, a power of two


@contextlib.contextmanager
def fresh_pool() -> Iterator[kvcache.Pool]:
    """A real pool for one hypothesis example (fixtures are per test, not per example)."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    pool = kvcache.create(name, "16K", page_size="1K", max_entries=MAX_ENTRIES)
    try:
        assert pool._engine.views.geometry.index_slots == SLOTS
        yield pool
    finally:
        pool.close()
        kvcache.destroy(name)


@pytest.fixture
def parts(make_pool: Callable[..., kvcache.Pool]) -> tuple[HashIndex, Views]:
    pool = make_pool("16K", page_size="1K", max_entries=MAX_ENTRIES)
    assert pool._engine.views.geometry.index_slots == SLOTS
    return pool._engine.table.index, pool._engine.views


def _set_hash(views: Views, eid: int, lo: int, hi: int) -> None:
    views.entries_q[eid * ENTRY_WORDS + E.hash_lo] = lo
    views.entries_q[eid * ENTRY_WORDS + E.hash_hi] = hi


def _slots(views: Views) -> list[int]:
    """Entry id per slot, -1 for empty."""
    return [int(v) - 1 for v in views.index]


def _check_probe_invariant(views: Views) -> None:
    """Linear probing's invariant: no empty slot between a member's home and its slot."""
    mask = SLOTS - 1
    slots = views.index_q
    for slot in range(SLOTS):
        if slots[slot]:
            home = views.entries_q[(slots[slot] - 1) * ENTRY_WORDS + E.hash_lo] & mask
            s = home
            while s != slot:
                assert slots[s], f"slot {s} is empty between home {home} and slot {slot}"
                s = (s + 1) & mask


def test_empty_index_finds_nothing(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    assert index.find(5, 5) == -1
    assert index.indexed_ids() == []
    index.remove(3, 5)  # removing what is absent is harmless
    assert _slots(views) == [-1] * SLOTS


def test_insert_find_remove(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    _set_hash(views, 0, 7, 70)
    _set_hash(views, 1, 7 + SLOTS, 71)  # same home slot 7, different hash
    _set_hash(views, 2, 7, 72)  # same hash_lo, different hash_hi
    for eid in range(3):
        index.insert(eid, views.entries_q[eid * ENTRY_WORDS + E.hash_lo])
    assert _slots(views)[7:10] == [0, 1, 2]
    assert index.find(7, 70) == 0
    assert index.find(7 + SLOTS, 71) == 1
    assert index.find(7, 72) == 2
    assert index.find(7, 73) == -1  # hash_hi decides too
    assert index.find(8, 70) == -1
    index.remove(0, 7)
    assert _slots(views)[7:10] == [1, 2, -1]  # shifted back, no tombstone
    assert index.find(7, 72) == 2
    assert sorted(index.indexed_ids()) == [1, 2]


def test_backward_shift_wraps_around_the_end(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    # four members homed at slot 30 fill 30, 31, 0, 1; one homed at 0 goes to 2
    for eid in range(4):
        _set_hash(views, eid, 30 + SLOTS * eid, eid)
        index.insert(eid, 30 + SLOTS * eid)
    _set_hash(views, 4, 0, 4)
    index.insert(4, 0)
    slots = _slots(views)
    assert [slots[30], slots[31], slots[0], slots[1], slots[2]] == [0, 1, 2, 3, 4]
    index.remove(0, 30)  # everything moves back one, across the end
    slots = _slots(views)
    assert [slots[30], slots[31], slots[0], slots[1], slots[2]] == [1, 2, 3, 4, -1]
    _check_probe_invariant(views)
    for eid in range(1, 5):
        lo = views.entries_q[eid * ENTRY_WORDS + E.hash_lo]
        assert index.find(lo, eid) == eid


def test_backward_shift_leaves_members_at_home(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    _set_hash(views, 0, 5, 0)  # slot 5
    _set_hash(views, 1, 6, 1)  # its own home: slot 6
    _set_hash(views, 2, 5 + SLOTS, 2)  # homed at 5, displaced to 7
    for eid in range(3):
        index.insert(eid, views.entries_q[eid * ENTRY_WORDS + E.hash_lo])
    index.remove(0, 5)
    slots = _slots(views)
    assert slots[5:8] == [2, 1, -1]  # 2 moves to its home; 1 stays at its own
    _check_probe_invariant(views)


def test_negative_hashes(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    _set_hash(views, 0, -1, -(2**63))  # home slot 31
    _set_hash(views, 1, -(2**63), 2**63 - 1)  # home slot 0
    index.insert(0, -1)
    index.insert(1, -(2**63))
    assert _slots(views)[31] == 0 and _slots(views)[0] == 1
    assert index.find(-1, -(2**63)) == 0
    assert index.find(-(2**63), 2**63 - 1) == 1
    index.remove(0, -1)
    assert index.find(-1, -(2**63)) == -1
    assert index.find(-(2**63), 2**63 - 1) == 1


def test_rebuild_indexes_exactly_the_given_ids(parts: tuple[HashIndex, Views]) -> None:
    index, views = parts
    for eid in range(6):
        _set_hash(views, eid, 29 + SLOTS * eid, eid)
    for eid in range(4):
        index.insert(eid, views.entries_q[eid * ENTRY_WORDS + E.hash_lo])
    index.rebuild([1, 4, 5])
    assert sorted(index.indexed_ids()) == [1, 4, 5]
    assert index.find(29, 0) == -1
    for eid in (1, 4, 5):
        assert index.find(29 + SLOTS * eid, eid) == eid
    _check_probe_invariant(views)


# hash_lo values whose home slots crowd the last slots and the first ones, so clusters
# form, merge and wrap; hash_hi tells keys with the same hash_lo apart
HOMES = st.sampled_from([0, 1, 2, 28, 29, 30, 31]) | st.integers(0, SLOTS - 1)
KEYS = st.tuples(HOMES, st.integers(-2, 2), st.integers(0, 2)).map(
    lambda t: (t[0] + SLOTS * t[1], t[2])  # (hash_lo, hash_hi)
)
OPS = st.lists(st.tuples(st.sampled_from(["insert", "remove", "find"]), KEYS), max_size=80)


@settings(max_examples=100, deadline=None)
@given(ops=OPS)
def test_index_against_a_dict(ops: list[tuple[str, tuple[int, int]]]) -> None:
    with fresh_pool() as pool:
        index, views = pool._engine.table.index, pool._engine.views
        model: dict[tuple[int, int], int] = {}
        free_ids = list(range(MAX_ENTRIES))
        seen: set[tuple[int, int]] = set()
        for op, key in ops:
            seen.add(key)
            lo, hi = key
            if op == "insert" and key not in model and free_ids:
                eid = free_ids.pop(0)  # reuse ids, so stale hashes linger in records
                _set_hash(views, eid, lo, hi)
                index.insert(eid, lo)
                model[key] = eid
            elif op == "remove" and key in model:
                eid = model.pop(key)
                index.remove(eid, lo)
                free_ids.append(eid)
            assert index.find(lo, hi) == model.get(key, -1)
            for other in seen:
                assert index.find(*other) == model.get(other, -1)
            assert sorted(index.indexed_ids()) == sorted(model.values())
            _check_probe_invariant(views)
