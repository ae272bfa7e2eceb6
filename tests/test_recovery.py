"""recovery: corrupt a real pool's derived structures; find_problems sees it, repair mends it.

Every test builds the same small pool, breaks one thing the way a crash or a stray
write could, and then checks that ``find_problems`` (and ``Pool.check``) report it,
that ``check(repair=True)`` fixes it, that the pool is consistent afterwards, that
every sound entry still reads back, and that the repaired pool keeps working.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import kvcache
from kvcache import recovery, transfer
from kvcache.keys import key_hash as _hash
from kvcache.layout import ENTRY_WORDS, NO_PAGE, READY, WRITING, E, H

Value = bytes | np.ndarray
Stored = dict[str, Value]


def _eid(pool: kvcache.Pool, key: str) -> int:
    eid = pool._engine.table.index.find(*_hash(key.encode()))
    assert eid >= 0, key
    return eid


def _field(pool: kvcache.Pool, eid: int, field: str) -> int:
    return pool._engine.views.entries_q[eid * ENTRY_WORDS + getattr(E, field)]


def _set(pool: kvcache.Pool, eid: int, field: str, value: int) -> None:
    pool._engine.views.entries_q[eid * ENTRY_WORDS + getattr(E, field)] = value


def _free_pages(pool: kvcache.Pool) -> list[int]:
    h, nxt = pool._engine.views.header_q, pool._engine.views.page_next_q
    pages, page = [], h[H.free_page_head]
    while page != NO_PAGE:
        pages.append(page)
        page = nxt[page]
    return pages


def _same(a: Value | None, b: Value) -> bool:
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    pool = make_pool("64K", page_size="1K")  # 64 pages, 64 entry slots
    return pool


@pytest.fixture
def stored(pool: kvcache.Pool) -> Stored:
    """Entries of one and several pages, an array, and a free list with holes in it."""
    values: Stored = {
        "a": b"A" * 100,
        "b": bytes(range(256)) * 10,  # 3 pages
        "c": b"C" * 5000,  # 5 pages
        "d": np.arange(300, dtype=np.float64),  # 3 pages
        "e": b"E" * 10,
    }
    for key, value in values.items():
        pool.put(key, value)
    pool.put("tmp1", b"1" * 2500)
    pool.put("tmp2", b"2" * 2500)
    pool.delete("tmp1")
    pool.delete("tmp2")
    values["f"] = b"F" * 1500  # 2 pages taken back from the free list
    pool.put("f", values["f"])
    assert pool.check() == []
    assert len(_free_pages(pool)) == 4
    return values


def _assert_repaired(
    pool: kvcache.Pool,
    stored: Stored,
    expect: str,
    dropped: tuple[str, ...] = (),
) -> None:
    problems = recovery.find_problems(pool._engine.recovery_parts())
    assert any(expect in p for p in problems), problems
    assert pool.check() == problems  # check() without repair changes nothing
    repairs = pool.stats().repairs
    assert pool.check(repair=True) == problems
    assert pool.check() == []
    assert pool.stats().repairs == repairs + 1
    for key, value in stored.items():
        if key in dropped:
            assert pool.get(key) is None, key
        else:
            assert _same(pool.get(key), value), key
    assert len(pool) == len(stored) - len(dropped)
    # the repaired pool keeps working: fill it, empty it, and stay consistent
    for i in range(20):
        pool.put(f"new{i}", bytes([i]) * 1800)
    assert pool.check() == []
    for key in list(pool):
        assert pool.delete(key)
    assert pool.check() == []
    assert len(pool) == 0 and pool.stats().used_bytes == 0
    assert pool._engine.table.allocator.num_available() == pool._engine.table.num_pages


# ------------------------------------------------------------------ free list


def test_free_list_head_points_at_an_owned_page(pool: kvcache.Pool, stored: Stored) -> None:
    pool._engine.views.header_q[H.free_page_head] = _field(pool, _eid(pool, "c"), "first_page")
    _assert_repaired(pool, stored, "free list")


def test_free_list_cycle(pool: kvcache.Pool, stored: Stored) -> None:
    first, second = _free_pages(pool)[:2]
    pool._engine.views.page_next_q[second] = first
    _assert_repaired(pool, stored, "free list")


@pytest.mark.parametrize("bad", [64, 10**9, -2])
def test_free_list_link_leaves_the_pool(pool: kvcache.Pool, stored: Stored, bad: int) -> None:
    pool._engine.views.page_next_q[_free_pages(pool)[0]] = bad
    _assert_repaired(pool, stored, "free list")


def test_free_list_cut_short_leaks_pages(pool: kvcache.Pool, stored: Stored) -> None:
    pool._engine.views.page_next_q[_free_pages(pool)[1]] = NO_PAGE
    _assert_repaired(pool, stored, "leaked")


def test_free_pages_counter(pool: kvcache.Pool, stored: Stored) -> None:
    pool._engine.views.header_q[H.num_free_pages] += 1
    _assert_repaired(pool, stored, "free pages counter")


def test_used_pages_counter(pool: kvcache.Pool, stored: Stored) -> None:
    pool._engine.views.header_q[H.used_pages] -= 3
    _assert_repaired(pool, stored, "used pages counter")


# ---------------------------------------------------------- index, live list


def test_dropped_index_slot(pool: kvcache.Pool, stored: Stored) -> None:
    slot = int(np.flatnonzero(pool._engine.views.index == _eid(pool, "b") + 1)[0])
    pool._engine.views.index[slot] = 0
    assert pool.get("b") is None  # really lost until repaired
    _assert_repaired(pool, stored, "key index")


def test_index_slot_for_a_free_entry(pool: kvcache.Pool, stored: Stored) -> None:
    free_slot = int(np.flatnonzero(pool._engine.views.index == 0)[0])
    pool._engine.views.index[free_slot] = (
        pool._engine.views.header_q[H.next_fresh_entry] + 1
    )  # never used
    _assert_repaired(pool, stored, "key index")


def test_live_list_count(pool: kvcache.Pool, stored: Stored) -> None:
    pool._engine.views.header_q[H.num_live] -= 1
    _assert_repaired(pool, stored, "live list")


def test_live_list_positions(pool: kvcache.Pool, stored: Stored) -> None:
    live = pool._engine.views.live
    live[0], live[1] = int(live[1]), int(live[0])  # ids swapped, live_pos not
    _assert_repaired(pool, stored, "live list")


# -------------------------------------------------------------------- entries


def test_chain_starts_outside_the_pool(pool: kvcache.Pool, stored: Stored) -> None:
    _set(pool, _eid(pool, "c"), "first_page", pool._engine.table.num_pages + 5)
    _assert_repaired(pool, stored, "leaves the pool", dropped=("c",))


def test_chain_link_leaves_the_pool(pool: kvcache.Pool, stored: Stored) -> None:
    first = _field(pool, _eid(pool, "b"), "first_page")
    pool._engine.views.page_next_q[first] = 10**6
    _assert_repaired(pool, stored, "leaves the pool", dropped=("b",))


def test_chain_ends_early(pool: kvcache.Pool, stored: Stored) -> None:
    first = _field(pool, _eid(pool, "d"), "first_page")
    pool._engine.views.page_next_q[first] = NO_PAGE
    _assert_repaired(pool, stored, "leaves the pool", dropped=("d",))


def test_chain_does_not_end_at_its_last_page(pool: kvcache.Pool, stored: Stored) -> None:
    eid = _eid(pool, "c")
    _set(pool, eid, "last_page", _field(pool, eid, "last_page") - 1)
    _assert_repaired(pool, stored, "last page", dropped=("c",))


def test_two_entries_share_a_page(pool: kvcache.Pool, stored: Stored) -> None:
    a, e = _eid(pool, "a"), _eid(pool, "e")
    assert a < e  # the survey keeps the first owner, in id order
    _set(pool, e, "first_page", _field(pool, a, "first_page"))
    _set(pool, e, "last_page", _field(pool, a, "first_page"))
    _assert_repaired(pool, stored, "another entry's", dropped=("e",))


def test_chain_that_loops_back_on_itself_is_dropped(pool: kvcache.Pool, stored: Stored) -> None:
    """Regression: a chain that revisits its own pages passed the overlap test (it only
    looked at other entries' pages), so repair kept an entry whose pages it counted
    twice; deleting it later freed a page twice and corrupted the counters."""
    eid = _eid(pool, "c")  # 5 adjacent pages p..p+4
    first = _field(pool, eid, "first_page")
    pool._engine.views.page_next_q[first + 2] = first + 1  # p, p+1, p+2, p+1, p+2
    _set(pool, eid, "last_page", first + 2)
    _assert_repaired(pool, stored, "visits a page twice", dropped=("c",))


def test_lengths_disagree_with_pages(pool: kvcache.Pool, stored: Stored) -> None:
    _set(pool, _eid(pool, "b"), "value_len", 100_000)
    _assert_repaired(pool, stored, "lengths", dropped=("b",))


def test_negative_key_length(pool: kvcache.Pool, stored: Stored) -> None:
    _set(pool, _eid(pool, "e"), "key_len", -1)
    _assert_repaired(pool, stored, "lengths", dropped=("e",))


def test_stale_duplicate_of_a_replaced_key(pool: kvcache.Pool, stored: Stored) -> None:
    """A crash between the halves of a replace: the old copy of a key is READY again."""
    old = _eid(pool, "a")
    pool.put("a", b"new A")  # the old slot and pages are freed, their bytes stay
    stored["a"] = b"new A"
    assert _field(pool, old, "state") != READY
    _set(pool, old, "state", READY)
    _assert_repaired(pool, stored, "older duplicate")


def test_two_ready_entries_with_one_key(pool: kvcache.Pool, stored: Stored) -> None:
    """Entry e is rewritten to carry key "a" as well: the newer one (e) wins."""
    a, e = _eid(pool, "a"), _eid(pool, "e")
    lo, hi = _hash(b"a")
    _set(pool, e, "hash_lo", lo)
    _set(pool, e, "hash_hi", hi)
    page = _field(pool, e, "first_page") * 1024
    pool._engine.views.data[page : page + 1] = b"a"
    _set(pool, e, "checksum", transfer.as_word(pool._engine.table.summed(e).computed()))
    assert _field(pool, e, "created") > _field(pool, a, "created")
    stored["a"] = stored["e"]
    _assert_repaired(pool, stored, "older duplicate", dropped=("e",))


def _dead_writer(pool: kvcache.Pool) -> tuple[int, int]:
    """The (slot, serial) that a process which opened ``pool`` and was killed held."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, kvcache; p = kvcache.open(sys.argv[1]); e = p._engine; "
            "print(e.slot, e.serial, flush=True); sys.stdin.read()",
            pool.name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    slot, serial = map(int, child.stdout.readline().split())
    assert pool._engine.procs.is_live(slot, serial)
    child.kill()
    child.communicate(timeout=20)
    return slot, serial


def _set_owner(pool: kvcache.Pool, eid: int, owner: tuple[int, int]) -> None:
    _set(pool, eid, "owner_slot", owner[0])
    _set(pool, eid, "owner_serial", owner[1])


def test_half_written_by_a_dead_process(pool: kvcache.Pool, stored: Stored) -> None:
    eid = _eid(pool, "b")
    owner = _dead_writer(pool)
    _set(pool, eid, "state", WRITING)
    _set_owner(pool, eid, owner)
    _assert_repaired(pool, stored, "which died", dropped=("b",))


def test_half_written_by_a_live_process_is_kept(pool: kvcache.Pool, stored: Stored) -> None:
    """A WRITING entry of a live writer owns its pages: nothing to report or drop."""
    eid = pool._engine.table.entries.claim()
    first, last = pool._engine.table.allocator.allocate(2)
    fields = {
        "state": WRITING,
        "key_len": 3,
        "value_len": 1500,
        "first_page": first,
        "last_page": last,
        "num_pages": 2,
    }
    for field, value in fields.items():
        _set(pool, eid, field, value)
    _set_owner(pool, eid, (pool._engine.slot, pool._engine.serial))
    assert pool.check() == []
    assert pool.check(repair=True) == []
    assert _field(pool, eid, "state") == WRITING
    _set_owner(pool, eid, _dead_writer(pool))
    _assert_repaired(pool, stored, "which died")


def test_half_written_by_an_earlier_holder_of_a_live_slot(
    pool: kvcache.Pool, stored: Stored
) -> None:
    """The writer's slot is held again, by someone else: the writer is still dead."""
    eid = pool._engine.table.entries.claim()
    first, last = pool._engine.table.allocator.allocate(1)
    for field, value in {
        "state": WRITING,
        "key_len": 3,
        "value_len": 100,
        "first_page": first,
        "last_page": last,
        "num_pages": 1,
    }.items():
        _set(pool, eid, field, value)
    _set_owner(pool, eid, (pool._engine.slot, pool._engine.serial - 1))
    _assert_repaired(pool, stored, "which died")


def test_free_entry_chain_reaching_a_live_entry(pool: kvcache.Pool, stored: Stored) -> None:
    """Regression: find_problems never looked at the chain of free entry slots, so a
    chain that led to a live entry passed check(), and the next put claimed that
    entry's slot and overwrote it under its live index and live-list positions."""
    pool._engine.views.header_q[H.free_entry_head] = _eid(pool, "a") + 1
    _assert_repaired(pool, stored, "free entry")


def test_free_entry_chain_cycle(pool: kvcache.Pool, stored: Stored) -> None:
    head = pool._engine.views.header_q[H.free_entry_head]
    assert head  # tmp1 and tmp2 freed two slots, f took one back
    _set(pool, head - 1, "next_free", head)
    _assert_repaired(pool, stored, "free entry")


# --------------------------------------------------------- crash detection


def test_dirty_flag_triggers_a_rebuild_on_the_next_lock(pool: kvcache.Pool, stored: Stored) -> None:
    """A holder that dies leaves ``dirty`` set: the next holder repairs first."""
    h = pool._engine.views.header_q
    h[H.used_pages] += 7
    pool._engine.views.index[:] = 0
    h[H.dirty] = 1
    assert _same(pool.get("c"), stored["c"])  # the index was rebuilt before the lookup
    assert h[H.dirty] == 0
    assert pool.stats().repairs == 1
    assert pool.check() == []


def test_a_consistent_pool_has_no_problems_and_repair_is_a_no_op(
    pool: kvcache.Pool, stored: Stored
) -> None:
    pool.stats()  # adds the byte counts this process kept back (kvcache.counters)
    before = bytes(pool._engine.views.raw[: pool._engine.views.geometry.data_offset])
    assert pool.check(repair=True) == []
    assert pool.stats().repairs == 0
    assert bytes(pool._engine.views.raw[: pool._engine.views.geometry.data_offset]) == before


def test_rebuild_of_an_empty_pool(pool: kvcache.Pool) -> None:
    recovery.rebuild(pool._engine.recovery_parts())
    assert pool.check() == []
    assert pool._engine.views.header_d[H.next_expiry_at] == float("inf")
    pool.put("k", b"v")
    assert pool.get("k") == b"v"


def test_rebuild_restores_the_next_expiry(pool: kvcache.Pool) -> None:
    pool.put("soon", b"x", ttl=60)
    pool.put("later", b"y", ttl=600)
    pool.put("never", b"z")
    expiry = pool._engine.views.header_d[H.next_expiry_at]
    pool._engine.views.header_d[H.next_expiry_at] = float("inf")
    recovery.rebuild(pool._engine.recovery_parts())
    assert pool._engine.views.header_d[H.next_expiry_at] == expiry


def test_check_without_repair_writes_nothing(make_pool) -> None:
    """Regression: a check clamped an out-of-range entry watermark even without repair."""
    pool = make_pool(size="64K", page_size="1K")
    pool.put("a", b"1")
    pool._engine.views.header_q[H.next_fresh_entry] = 10**9  # white-box damage
    before = bytes(pool._engine.views.raw[: pool._engine.views.geometry.data_offset])
    assert any("watermark" in p for p in pool.check())
    after = bytes(pool._engine.views.raw[: pool._engine.views.geometry.data_offset])
    assert before == after
    pool.check(repair=True)
    assert pool.check() == [] and pool.get("a") == b"1"


def test_a_record_claiming_more_pages_than_the_pool_is_reported_not_walked(make_pool) -> None:
    pool = make_pool(size="64K", page_size="1K")
    pool.put("a", b"1")
    pool._engine.views.entries_q[0 * ENTRY_WORDS + E.num_pages] = 2**40  # white-box damage
    assert any("entry 0" in p for p in pool.check())


def test_bug_opening_a_pool_whose_dead_writer_left_damaged_counters_raised_value_error(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    """Regression: an open reclaims a dead writer's WRITING entry; on a damaged count of free
    pages that overflowed in ``PageAllocator.free`` and escaped as ValueError (destroy
    failed with it too). It is a CorruptPoolError now, and destroy removes the pool."""
    pool = make_pool("256K", page_size="1K")
    engine = pool._engine
    with engine.lock:
        engine.table.reserve(0, b"k", 0, 10, 1, 0, float("inf"), True)  # WRITING, then dies
    engine.views.header_q[H.num_free_pages] = 2**63 - 1
    pool.close()  # its process slot goes: the entry's writer is dead to the next opener
    with pytest.raises(kvcache.CorruptPoolError):
        kvcache.open(pool.name)
    kvcache.destroy(pool.name)
    assert pool.name not in kvcache.list_pools()
