"""Damaged segment metadata: never a hang, never a foreign exception, and repair mends all.

A buggy writer or a bad DIMM can change any word of a live segment. The
contract: every pool operation either works or raises ``CorruptPoolError``
(whose message says to run ``kvcache health --repair``); it never hangs
and never raises IndexError, OverflowError, ValueError or UnicodeDecodeError.
``check()`` reports what an operation would trip over, and after
``check(repair=True)`` everything works, ``check() == []``, and every value
still there is the one that was stored.

The damage is real: words of a real pool's shared header, entry table, key
index, live list and page links are overwritten, then the public API is used
as an application would. Every example runs under an alarm, so a hang fails
the test instead of stopping the suite.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kvcache
from kvcache import CorruptPoolError, transfer
from kvcache.keys import key_hash
from kvcache.layout import (
    DESTROYED,
    ENTRY_DTYPE,
    ENTRY_WORDS,
    HEADER_DTYPE,
    READY,
    REPLACED,
    E,
    H,
)
from kvcache.mapping import same_value
from kvcache.policies import POLICIES
from kvcache.pool import ENTRY_SORTS
from multiprocess.workers import deadline  # tests/ is on sys.path, as for every test here

HANG_S = 20  # far beyond any operation on these small pools


def alarm(seconds: float = HANG_S) -> contextlib.AbstractContextManager[None]:
    """Raise ``Deadlock`` in this thread if the block runs longer than ``seconds``."""
    return deadline(seconds)


VALUES: dict[str | bytes, object] = {
    "small": b"s" * 100,
    "pages": bytes(range(256)) * 12,  # 3 KiB: several 1 KiB pages
    b"\x00bytes": b"\xff" * 10,
    "array": np.arange(300, dtype=np.float64),
    "ключ": b"k" * 1500,
    "empty": b"",
    "large": np.arange(20_000, dtype=np.int32),  # 80 KB: copied outside the lock
}


def fill(pool: kvcache.Pool) -> None:
    """VALUES, a freed hole in the page list, a ttl, priorities and some hits."""
    for i, (key, value) in enumerate(VALUES.items()):
        pool.put(key, value, priority=i - 3, ttl=3600 if i % 2 else None)  # type: ignore[arg-type]
    pool.put("gone", b"g" * 2500)
    pool.delete("gone")
    for key in ("small", "array", "small"):
        pool.get(key)
    assert pool.check() == []


@contextlib.contextmanager
def damaged_pool(policy: str = "lru", inline_bytes: int = 0) -> Iterator[kvcache.Pool]:
    """A filled real pool, destroyed afterwards (hypothesis examples need their own); with
    ``inline_bytes``, its smallest values lie in inline slots."""
    name = f"test-damage-{uuid.uuid4().hex[:10]}"
    pool = kvcache.create(name, "256K", page_size="1K", policy=policy, inline_bytes=inline_bytes)
    try:
        fill(pool)
        yield pool
    finally:
        with contextlib.suppress(kvcache.KVCacheError):
            pool.close()
        try:
            kvcache.destroy(name)
        finally:  # a pool damaged past opening (or marked retired) is removed as a file
            kvcache.segment.segment_path(name).unlink(missing_ok=True)


def operations(pool: kvcache.Pool, folder: Path) -> list[tuple[str, Callable[[], object]]]:
    """Every public operation, as an application would call it."""
    buffer = bytearray(100_000)
    ops: list[tuple[str, Callable[[], object]]] = [
        ("get", lambda: [pool.get(key) for key in VALUES]),
        ("get absent", lambda: pool.get("absent")),
        ("get_into", lambda: [pool.get_into(key, buffer) for key in ("small", "large")]),
        ("contains", lambda: [key in pool for key in (*VALUES, "absent")]),
        ("len", lambda: len(pool)),
        ("keys", lambda: pool.keys()),
        ("iter", lambda: list(pool)),
        ("items", lambda: list(pool.items())),
        ("stats", lambda: pool.stats()),
        ("ttl", lambda: [pool.ttl(key) for key in VALUES if key in pool]),
        ("touch", lambda: pool.touch("pages", ttl=60)),
        ("put new", lambda: pool.put("new", b"n" * 2000)),
        ("put over", lambda: pool.put("small", VALUES["small"])),
        ("put large", lambda: pool.put("new large", b"L" * 70_000)),
        ("delete", lambda: pool.delete("new")),
        ("pop", lambda: pool.pop("new large", None)),
        ("persist", lambda: kvcache.persist(pool, folder / "damaged.kvsnap")),
        ("evict expired", lambda: pool.evict(expired=True)),
        ("evict", lambda: pool.evict(percent=5)),
        ("fill up", lambda: [pool.put(f"fill{i}", b"f" * 9000) for i in range(40)]),
    ]
    for sort in ENTRY_SORTS:
        ops.append((f"entries {sort}", lambda sort=sort: pool.entries(sort=sort)))  # type: ignore[misc]
    return ops


def run_all(pool: kvcache.Pool, folder: Path, *, damaged: bool) -> None:
    """Each operation works or, on a damaged pool, raises CorruptPoolError; none hangs.

    A damaged pool is checked first: whatever an operation trips over, ``check()``
    must have reported (and a check never raises).
    """
    with alarm():
        problems = pool.check()
    for name, op in operations(pool, folder):
        try:
            with alarm():
                op()
        except CorruptPoolError as exc:
            assert damaged, f"{name} failed on a repaired pool: {exc}"
            assert problems, f"check() found nothing, then {name} raised {exc}"
            assert "kvcache health" in str(exc) and "--repair" in str(exc)
            event(f"CorruptPoolError from {name}")


def assert_repaired(pool: kvcache.Pool, folder: Path) -> None:
    """After check(repair=True): consistent, working, and no value other than what was put."""
    with alarm():
        pool.check(repair=True)
        assert pool.check() == []
    for key, value in VALUES.items():
        got = pool.get(key)
        assert got is None or same_value(got, value), key
    run_all(pool, folder, damaged=False)
    assert pool.check() == []
    kvcache.open(pool.name).close()  # the header is fit for a new process too


# ------------------------------------------------------------------ regressions


def test_bug_index_without_an_empty_slot_hung_every_process() -> None:
    """Regression: with every index slot holding a live id, get/put of a missing key
    probed forever with the pool lock held (so every process blocked), and check()
    and repair both returned []. Now the probe fails, and the pool stays marked dirty,
    so the next call's lock repairs it."""

    def fill_the_index(pool: kvcache.Pool) -> None:
        live = pool._engine.views.live[: len(pool)].copy()
        pool._engine.views.index[:] = np.resize(live + 1, pool._engine.views.index.size)

    with damaged_pool() as pool:
        for op in (
            lambda: pool.get("absent"),
            lambda: pool.put("absent", b"x"),
            lambda: pool.delete("absent"),
            lambda: "absent" in pool,
        ):
            fill_the_index(pool)
            repairs = pool.stats().repairs
            with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
                op()
            assert pool.check() == []  # its lock found the pool dirty and rebuilt the index
            assert pool.stats().repairs == repairs + 1
            pool.delete("absent")
        fill_the_index(pool)
        with alarm():
            assert any("no empty slot" in p for p in pool.check())
            assert pool.check(repair=True) != []
        assert pool.check() == []
        assert all(same_value(pool.get(key), value) for key, value in VALUES.items())
        pool.put("absent", b"x")
        assert pool.get("absent") == b"x"


def test_bug_last_access_beyond_the_clock_overflowed_get() -> None:
    """Regression: an entry's last_access set to 2**40 passed check(repair=True) == [],
    then get raised OverflowError (LFU's decay 2.0 ** (-idle / half_life))."""
    with damaged_pool("lfu") as pool:
        eid = pool._engine.table.index.find(*key_hash(b"small"))
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.last_access] = 2**40
        with pytest.raises(CorruptPoolError, match="OverflowError"):
            pool.get("small")
        assert pool.get("small") == VALUES["small"]  # the lock saw the error: next holder repaired
        assert pool.stats().repairs == 1
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.last_access] = 2**40
        problems = pool.check()
        assert any(f"entry {eid}: its last_access" in p for p in problems)
        assert pool.check(repair=True) == problems
        assert pool.check() == [] and pool.get("small") == VALUES["small"]


@pytest.mark.parametrize("read", ["get", "locate"])
def test_bug_a_damaged_value_length_was_counted_and_broke_close(read: str) -> None:
    """Regression: a get or locate added an entry's value_len to the bytes-out count before
    anything checked it; 2**63 - 1 then overflowed the metrics word when the pool closed
    (ValueError from close, after the read had rightly raised CorruptPoolError)."""
    with damaged_pool() as pool:
        eid = pool._engine.table.index.find(*key_hash(b"large"))
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.value_len] = 2**63 - 1
        with pytest.raises(CorruptPoolError):
            pool.get("large") if read == "get" else pool.locate("large")
        pool.close()  # raised ValueError: memoryview: invalid value for format 'q'


@pytest.mark.parametrize(
    ("field", "value", "use"),
    [
        ("clock", 2**63 - 1, lambda pool: pool.put("k", b"v")),  # the next tick overflows
        ("hits", 2**63 - 1, lambda pool: pool.get("small")),
        ("num_live", -2, len),  # len() itself would raise ValueError
    ],
)
def test_header_word_out_of_range_is_reported_and_mended(tmp_path, field, value, use) -> None:
    with damaged_pool() as pool:
        pool._engine.views.header_q[getattr(H, field)] = value
        assert any(f"{field} {value}" in p or "live list" in p for p in pool.check())
        with pytest.raises(CorruptPoolError, match="--repair"):
            use(pool)
        assert_repaired(pool, tmp_path)


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "prefix"])
def test_bug_a_ghost_count_past_the_ring_hung_eviction(tmp_path, policy) -> None:
    """The fuzz found it: a header ghost count above the ghosts the ring holds made the
    search for the oldest ghost walk round the ring for ever, under the pool lock."""
    with damaged_pool(policy) as pool:
        pool._engine.views.header_q[H.num_ghosts_probation] = 63
        assert any("ghost counts" in p for p in pool.check())
        with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
            for i in range(1000):  # a full pool: evictions forget the oldest ghosts
                pool.put(f"more-{i}", b"m" * 3000)
        assert_repaired(pool, tmp_path)


def test_bug_a_key_length_past_the_limit_was_listed(tmp_path) -> None:
    """The fuzz found it (seeds 150, 151): a key length above the longest key a put takes,
    still inside the entry's pages, was listed as a key by keys() and items(), whose get of
    it then raised InvalidArgument, where damage is CorruptPoolError."""
    with damaged_pool() as pool:
        eid = pool._engine.table.index.find(*key_hash("ключ".encode()))
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.key_len] = 1100  # text past 1024
        assert pool.check()
        with pytest.raises(CorruptPoolError, match="--repair"):
            pool.keys()
        assert_repaired(pool, tmp_path)


def full_of_ghosts(pool: kvcache.Pool) -> None:
    """Puts past the pool's size: evictions leave ghosts (queue policies)."""
    for i in range(200):
        pool.put(f"more-{i}", b"m" * 3000)


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "prefix"])
@pytest.mark.parametrize("word", ["ghost_next", "ghost_tail_main", "ghost_tail_probation"])
def test_bug_a_ghost_position_out_of_range_passed_check(tmp_path, policy, word) -> None:
    """The fuzz found it (seed 110): a negative ghost_next passed check(), then the search
    for the oldest ghost found none and every eviction raised CorruptPoolError, after
    repair too (clearing the ghosts kept the position)."""
    with damaged_pool(policy) as pool:
        full_of_ghosts(pool)
        pool._engine.views.header_q[getattr(H, word)] = -52484548
        assert any("ghost ring positions" in p for p in pool.check())
        assert_repaired(pool, tmp_path)
        full_of_ghosts(pool)
        assert pool.check() == []


def test_bug_probations_tail_linked_into_main_hung_prefixs_admission(tmp_path) -> None:
    """Found by the damage fuzz: probation's oldest chunk, its link to the one before
    damaged to name a chunk of main, left that chunk as probation's tail once it moved to
    main; ``prefix``'s admission then moved it within main for ever (a move from main
    takes nothing off probation) under the pool lock. A list's tail must be of that list."""
    with damaged_pool("prefix") as pool:
        v = pool._engine.views
        oldest = v.header_q[H.probation_tail] - 1
        in_main = int(
            np.flatnonzero((v.entries["state"] == READY) & (v.entries["probation"] == 0))[0]
        )
        assert oldest >= 0
        v.entries["queue_prev"][oldest] = in_main + 1
        assert pool.check() != []
        with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
            for i in range(40):
                pool.put(f"fill{i}", b"f" * 9000)
        assert_repaired(pool, tmp_path)


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "prefix"])
def test_bug_a_ghost_chain_that_loops_hung_puts(tmp_path, policy) -> None:
    """A ghost bucket's chain must lead to older ghosts: one that loops made a put of a
    new key (which asks whether it is a ghost) walk for ever under the pool lock."""
    with damaged_pool(policy) as pool:
        full_of_ghosts(pool)
        words = np.frombuffer(pool._engine.views.ghost_q, np.int64)
        length = len(words) // 3
        heads = words[2 * length :]
        looped = heads > 0
        assert looped.any()
        for found in heads[looped].tolist():  # each newest ghost names itself as older
            words[length + (found - 1) % length] = found
        assert any("ghost index" in p for p in pool.check())
        with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
            for i in range(300):
                pool.put(f"new-{i}", b"n" * 10)
        assert_repaired(pool, tmp_path)


@pytest.mark.parametrize(
    ("word", "value"),
    [("regret_accesses_sum", 2**63 - 1), ("regret_next", -3), ("regret_seconds", 2**62)],
)
def test_bug_a_regret_word_out_of_range_passed_check(tmp_path, word, value) -> None:
    """The fuzz found it (seed 108): a regret sum at 2**63 - 1 passed check(), and the next
    request for a sampled evicted key overflowed the word (ValueError), after repair too."""
    with damaged_pool() as pool:
        pool._engine.views.header_q[getattr(H, word)] = value
        assert any("eviction regret" in p for p in pool.check())
        assert_repaired(pool, tmp_path)
        full_of_ghosts(pool)  # evicts sampled keys
        for i in range(200):
            pool.get(f"more-{i}")  # asks for them again: counted in the sums
        assert pool.metrics().regret.accesses.count > 0
        assert pool.check() == []


@pytest.mark.parametrize("policy", ["arc", "prefix"])
@pytest.mark.parametrize("child", [257, 2**40, -5])
def test_bug_a_child_link_out_of_range_broke_check(tmp_path, policy, child) -> None:
    """CI's fuzz found it: a damaged first_child word made check() index past the entry
    table (IndexError) instead of reporting the tree as damaged."""
    with damaged_pool(policy) as pool:
        pool._engine.views.entries_q[0 * ENTRY_WORDS + E.first_child] = child
        assert any("chunk tree" in p for p in pool.check())
        assert_repaired(pool, tmp_path)


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [
        ("small", "next_sibling", -1),  # the fuzz's case: a root with a sibling
        ("small", "prev_sibling", 3),
        ("b", "prev_sibling", -1),  # a child whose back link leaves the table
        ("a", "prev_sibling", 0),  # the last child whose back link says it is the first
    ],
)
def test_bug_a_damaged_sibling_link_passed_check_and_broke_later_puts(
    tmp_path, key, field, value
) -> None:
    """The fuzz found it: check() walked only the forward links of each parent's children,
    so a root's sibling link or a child's back link was never reported, repair left it,
    and the repaired pool's next put over that key or eviction raised CorruptPoolError."""
    with damaged_pool("prefix") as pool:
        pool.put("root", b"r" * 100)
        for leaf in ("a", "b"):  # "b" is linked last: the first child
            pool.put(leaf, b"l" * 100, parent="root")
        assert pool.check() == []
        eid = pool._engine.table.find(key.encode())
        pool._engine.views.entries_q[eid * ENTRY_WORDS + getattr(E, field)] = value
        assert any("chunk tree" in p for p in pool.check())
        assert_repaired(pool, tmp_path)


@pytest.mark.parametrize("operation", ["delete", "replace"])
def test_bug_a_loop_in_a_child_list_hung_delete_and_replace(tmp_path, operation) -> None:
    """The fuzz found it: a sibling link pointing back made the walk over a chunk's
    descendants (delete, eviction) or children (a put replacing a chunk) run forever."""
    with damaged_pool("prefix") as pool:
        pool.put("root", b"r" * 100)
        for leaf in ("a", "b"):
            pool.put(leaf, b"l" * 100, parent="root")
        eid = pool._engine.table.find(b"a")
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.next_sibling] = (
            eid + 1
        )  # "a" is its own next sibling
        with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
            if operation == "delete":
                pool.delete("root")
            else:
                pool.put("root", b"R" * 100)
        assert_repaired(pool, tmp_path)


def test_bug_a_parent_link_in_a_pool_without_a_tree_stranded_later(tmp_path) -> None:
    """The fuzz found it: repair relinked a damaged parent word in an lru/ttl pool, whose
    deletes do not cascade, so a later delete of the 'parent' left a stranded entry."""
    with damaged_pool("ttl") as pool:
        eids = sorted(pool._engine.table.find(key.encode()) for key in ("small", "array"))
        pool._engine.views.entries_q[eids[1] * ENTRY_WORDS + E.parent] = eids[0] + 1
        assert any("parent is set in a pool that keeps no chunk tree" in p for p in pool.check())
        pool.check(repair=True)
        assert pool._engine.views.entries_q[eids[1] * ENTRY_WORDS + E.parent] == 0
        pool.clear()
        assert pool.check() == []


def test_a_loop_in_parent_links_is_damage_not_a_hang(tmp_path) -> None:
    """Replacing a chunk walks up from its new parent (is it below the chunk?): bounded."""
    with damaged_pool("prefix") as pool:
        pool.put("r", b"r" * 100)
        for key, parent in (("a", "r"), ("c", "a"), ("b", "r")):
            pool.put(key, b"v" * 100, parent=parent)
        a, c = pool._engine.table.find(b"a"), pool._engine.table.find(b"c")
        pool._engine.views.entries_q[a * ENTRY_WORDS + E.parent] = c + 1  # a -> c -> a ...
        with alarm(), pytest.raises(CorruptPoolError, match="--repair"):
            pool.put("b", b"w" * 100, parent="a")
        assert_repaired(pool, tmp_path)


def test_text_key_that_is_not_utf8_is_dropped_by_repair() -> None:
    """The key's bytes and checksum are rewritten together (as a writer that
    means it would): only the meaning of the key can tell it is wrong."""
    with damaged_pool() as pool:
        eid = pool._engine.table.index.find(*key_hash("ключ".encode()))
        start = (
            pool._engine.views.entries_q[eid * ENTRY_WORDS + E.first_page]
            * pool._engine.table.page_size
        )
        pool._engine.table.data[start] = 0xFF
        pool._engine.views.entries_q[eid * ENTRY_WORDS + E.checksum] = transfer.as_word(
            pool._engine.table.summed(eid).computed()
        )
        (
            pool._engine.views.entries_q[eid * ENTRY_WORDS + E.hash_lo],
            pool._engine.views.entries_q[eid * ENTRY_WORDS + E.hash_hi],
        ) = key_hash(bytes(pool._engine.table.key_view(eid)))
        assert any(f"entry {eid}: its text key is not UTF-8" in p for p in pool.check())
        with pytest.raises(CorruptPoolError, match="UnicodeDecodeError"):
            pool.keys()
        pool.check(repair=True)
        assert pool.check() == [] and "ключ" not in pool


def test_damaged_policy_in_the_header_is_written_back() -> None:
    """Open refuses a header whose configuration is damaged; a process that has the
    pool open still knows it, and its repair writes it back."""
    with damaged_pool() as pool:
        pool._engine.views.header["policy"] = b"bogus"
        with pytest.raises(kvcache.IncompatiblePoolError):
            kvcache.open(pool.name)
        assert any("header policy" in p for p in pool.check())
        pool.check(repair=True)
        assert pool.check() == []
        kvcache.open(pool.name).close()


# ------------------------------------------------------------------- the fuzz

HEADER_FIELDS = [n for n in HEADER_DTYPE.names if not HEADER_DTYPE[n].shape]  # one word each
ENTRY_FIELDS = list(ENTRY_DTYPE.names)
INTS = [0, 1, -1, 2, 63, 64, 255, 256, 257, 511, 512, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]
FLOATS = [0.0, -1.0, 1.0, math.nan, math.inf, -math.inf, 1e300, -1e300, 5e-324]


def word(data: st.DataObject, kind: str, old: object) -> object:
    """A damaging value for a field of numpy kind ``kind`` that held ``old``."""
    if kind == "f":
        return data.draw(st.sampled_from(FLOATS) | st.floats(), label="float")
    if kind == "S":
        return data.draw(st.binary(max_size=16), label="bytes")
    return data.draw(
        st.sampled_from(INTS)
        | st.integers(-3, 600)
        | st.integers(-(2**63), 2**63 - 1)
        | st.sampled_from([max(int(old), -(2**63) + 1) - 1, min(int(old), 2**63 - 2) + 1]),  # type: ignore[call-overload]
        label="int",
    )


def damage(pool: kvcache.Pool, data: st.DataObject) -> str:
    """Overwrite one word of the pool's metadata; return which region (for statistics)."""
    v = pool._engine.views
    target = data.draw(st.sampled_from(["header", "entry", "entry", "index", "live", "links"]))
    if target == "header":
        name = data.draw(st.sampled_from(HEADER_FIELDS))
        value = word(data, HEADER_DTYPE.fields[name][0].kind, v.header[name])  # type: ignore[index]
        if name == "retired" and value in (DESTROYED, REPLACED):
            value = 3  # those two say the pool was destroyed or replaced: taken as said
        v.header[name] = value
        return f"header {name}"
    if target == "entry":
        used = min(max(1, int(v.header_q[H.next_fresh_entry])), v.geometry.max_entries)
        eid = data.draw(st.integers(0, used - 1) | st.integers(0, v.geometry.max_entries - 1))
        name = data.draw(st.sampled_from(ENTRY_FIELDS))
        value = word(data, ENTRY_DTYPE.fields[name][0].kind, v.entries[name][eid])  # type: ignore[index]
        v.entries[name][eid] = value
        return f"entry {name}"
    array = {"index": v.index, "live": v.live, "links": v.page_next}[target]
    slot = data.draw(st.integers(0, len(array) - 1))
    value = word(data, "i", array[slot])
    array[slot] = value
    return target


@settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(), policy=st.sampled_from(sorted(POLICIES)), inline=st.sampled_from([0, 0, 128])
)
def test_any_damage_fails_cleanly_and_repair_mends_it(tmp_path, data, policy, inline) -> None:
    with damaged_pool(policy, inline) as pool:
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            event(damage(pool, data))
        run_all(pool, tmp_path, damaged=True)
        assert_repaired(pool, tmp_path)
