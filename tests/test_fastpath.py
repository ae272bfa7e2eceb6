"""The compiled get hit and small put (``kvcache.fastpath``, ``kvcache._lookup``) against
the Python engine.

The C code answers a plain hit, a clean miss (ABSENT), a small value's copy,
summed against its checksum when the pool verifies reads, and a small put that
needs no eviction, and says "not here" (-1, None) for anything else, so the
Python engine decides every other case and every damaged word. These tests hold
it to that: the same operations (a flipped payload byte among them) on a
compiled and a pure-Python pool leave the same answers and the same segment,
byte for byte; words of the index, entry table, page links and header
overwritten at random give either the Python path's answer (and segment) or
nothing, never a crash; and processes of both engines share one pool.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvcache
from kvcache import CorruptPoolError, fastpath, native
from kvcache.keys import encode_key, key_hash
from kvcache.layout import DEFERRED_SLOTS, ENTRY_DTYPE, ENTRY_WORDS, HEADER_DTYPE, READY, E, H
from kvcache.lock import owner_word
from kvcache.policies import POLICIES, rank_victims
from kvcache.policies.base import RANKING_FIELDS
from kvcache.regret import sample_shift
from test_segment_damage import VALUES, damaged_pool, word

compiled = pytest.mark.skipif(
    native.Finder is None, reason="kvcache._lookup is not built or KVCACHE_PURE_PYTHON is set"
)
PLAIN_POLICIES = ("lru", "lfu", "fifo", "ttl", "priority", "size")
"""The policies without queues, whose hit may be read without the lock."""
X86_64 = os.uname().machine == "x86_64"
QUEUE_WORDS = ("probation_head", "probation_tail", "main_head", "main_tail", "num_probation")
DAMAGE_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""The damage fuzzes' settings: fresh examples each run (no database), each its own pool."""


class Ticks:
    """A wall clock that moves only when told (both pools of a comparison read the same)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def new_pool(
    policy: str,
    clock: Ticks,
    *,
    pure: bool,
    lfu_half_life: int | None = None,
    verify_reads: bool | None = None,
    inline_bytes: int = 0,
    eviction_samples: int = 64,
) -> Iterator[kvcache.Pool]:
    name = f"test-fastpath-{uuid.uuid4().hex[:10]}"
    pool = kvcache.create(
        name,
        "256K",
        page_size="1K",
        policy=policy,
        clock=clock,
        lfu_half_life=lfu_half_life,
        verify_reads=verify_reads,
        inline_bytes=inline_bytes,
        eviction_samples=eviction_samples,
    )
    if pure:
        # the reference: Table.lookup's Python path only, under the lock
        engine = pool._engine
        engine.table.fast = engine._read_unlocked = engine._present = engine._put = None
        engine._reserve_compiled = engine._publish_compiled = engine.evictor._evict = None
        engine._delete = engine.evictor._make_room = None
    try:
        yield pool
    finally:
        pool.close()
        kvcache.destroy(name)


IN_THE_WAY = ["held", "flock user", "dirty", "retired"]


@contextlib.contextmanager
def word_in_the_way(engine, in_the_way: str) -> Iterator[None]:
    """Plant what keeps a compiled call from taking the lock word itself (``IN_THE_WAY``):
    the word held by another process, a flock-only process counted, a holder that died
    mid-way (``dirty``), the pool retired."""
    at, value = {
        "held": (H.lock_word, owner_word(engine.slot + 1, 7)),
        "flock user": (H.flock_users, 1),
        "dirty": (H.dirty, 1),
        "retired": (H.retired, 1),
    }[in_the_way]
    engine.views.header_q[at] = value
    try:
        yield
    finally:
        engine.views.header_q[at] = 0


@compiled
def test_every_policy_takes_the_compiled_path_and_reads_without_the_lock():
    """On x86-64: a plain policy's read touches its hit alone; a queue policy's takes the
    lock word for it, so without the word it is left to the lock."""
    for policy in POLICIES:
        with new_pool(policy, Ticks(), pure=False) as pool:
            pool.put("k", b"v")
            engine = pool._engine
            assert engine.table.fast is not None, policy
            read, raw = engine.table.fast.read, engine.views.raw
            wordless = read(raw, b"k", 0.0, None, False)
            assert (wordless == b"v") == (policy in PLAIN_POLICIES and X86_64), policy
            assert (read(raw, b"k", 0.0, None, False, engine.lock.word) == b"v") == X86_64, policy


@contextlib.contextmanager
def queue_pools(policy: str) -> Iterator[tuple[kvcache.Pool, kvcache.Pool, Ticks]]:
    """A compiled and a pure-Python pool of ``policy`` on one clock, holding the same six
    values (``value_of``) on probation."""
    clock = Ticks()
    with new_pool(policy, clock, pure=False) as fast, new_pool(policy, clock, pure=True) as ref:
        for pool in (fast, ref):
            for i in range(6):
                pool.put(f"k{i}", value_of(i))
        yield fast, ref, clock


def value_of(i: int) -> bytes:
    return bytes([i]) * (3000 if i % 2 else 40)


@compiled
@pytest.mark.skipif(not X86_64, reason="reads take the lock off x86-64 (kvcache._lookup)")
@pytest.mark.parametrize("policy", ["s3fifo", "arc", "prefix"])
@pytest.mark.parametrize("in_the_way", [way for way in IN_THE_WAY if way != "held"])
def test_a_queue_hit_read_without_the_lock_takes_a_free_word_or_leaves_it_to_the_lock(
    policy: str, in_the_way: str
) -> None:
    """A queue policy's get copies without the lock and makes its hit (a read counted, a
    move to main's head) under the lock word, which C takes where it is free: the words the
    locked path writes, and the word and ``dirty`` zero after. Where a flock-only process
    is counted, a holder died mid-way or the pool is retired, the read answers None having
    written nothing, for the lock to decide (a word merely held: the next test)."""
    with queue_pools(policy) as (fast, ref, clock):
        engine = fast._engine
        header, raw, word = engine.views.header_q, engine.views.raw, engine.lock.word
        read = engine.table.fast.read
        assert word  # this process locks by the word
        for i in (0, 3, 0, 5):  # from probation to main, then read again
            assert read(raw, encode_key(f"k{i}")[0], clock(), None, False, word) == value_of(i)
            assert ref.get(f"k{i}") == value_of(i)
            assert header[H.lock_word] == header[H.dirty] == 0
        assert_same_segment(fast, ref)
        with word_in_the_way(engine, in_the_way):
            before = bytes(raw)
            assert read(raw, encode_key("k1")[0], clock(), bytearray(3000), False, word) is None
            assert bytes(raw) == before


@compiled
def test_the_ring_of_deferred_hits_is_as_long_in_c_as_in_the_layout() -> None:
    from kvcache import _lookup  # type: ignore[attr-defined]

    assert _lookup.DEFERRED_SLOTS == DEFERRED_SLOTS
    assert HEADER_DTYPE.fields["deferred"][0].shape == (DEFERRED_SLOTS,)


@compiled
@pytest.mark.skipif(not X86_64, reason="reads take the lock off x86-64 (kvcache._lookup)")
@pytest.mark.parametrize("policy", ["s3fifo", "arc", "prefix"])
@pytest.mark.parametrize("holder", ["drain", "put", "evict"])
def test_a_queue_hit_read_while_another_holds_the_lock_is_made_by_the_holder(
    policy: str, holder: str
) -> None:
    """Where another process holds the lock word, a queue policy's get is answered at once:
    its hit's own words (the clock, the count, the access) are written without the lock
    and its queue part left in the header's ring, which the lock's next holder makes before
    it queues a put or chooses a victim (``Table.drain_deferred``). The segment then holds
    what the locked path's hits leave (a put and an evict after them included); with the
    ring not drained it does not (entries stay on probation)."""
    with queue_pools(policy) as (fast, ref, clock):
        engine = fast._engine
        raw, word, read = engine.views.raw, engine.lock.word, engine.table.fast.read
        keys = ("k1", "k4", "k1", "k2")
        with word_in_the_way(engine, "held"):
            for key in keys:
                assert read(raw, encode_key(key)[0], clock(), None, False, word) is not None
                assert ref.get(key) is not None
        positions = ("deferred_next", "deferred_done")  # the ring's bookkeeping: 4 hits
        assert engine.views.header["deferred_next"] == len(keys)
        with pytest.raises(AssertionError):
            assert_same_segment(fast, ref, positions)  # the queue moves wait in the ring
        for pool in (fast, ref):
            if holder == "drain":
                with pool._engine.lock:
                    pool._engine.table.drain_deferred()
            elif holder == "put":
                pool.put("k9", b"new")
            else:
                pool.evict(percent=30)
        assert engine.views.header["deferred_done"] == len(keys)
        assert_same_segment(fast, ref, positions)
        with engine.lock:  # drained once: nothing is made twice
            assert engine.table.fast.drain(raw) == 0


@compiled
@given(st.binary(min_size=1, max_size=300))
def test_the_key_hash_in_c_is_the_index_hash(key: bytes) -> None:
    from kvcache import _lookup  # type: ignore[attr-defined]

    assert _lookup.key_hash(key) == key_hash(key)


KEYS = ["a", "b", "ключ", b"\x00raw", "long" * 40, *(f"k{i}" for i in range(8))]
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["put", "get", "get", "get", "get_into", "delete", "tick", "contains", "damage"]
        ),
        st.sampled_from(KEYS),
        st.sampled_from([0, 1, 100, 1023, 1024 - 5, 3000, 70_000]),  # value bytes
        st.sampled_from([None, None, 5.0]),  # ttl
    ),
    max_size=40,
)


def flip_a_payload_byte(pool: kvcache.Pool, key: str | bytes, at: int) -> bool:
    """Flip one byte of ``key``'s value in the shared pages, as a stray writer would; whether
    there was one to flip."""
    table = pool._engine.table
    key_bytes, _ = encode_key(key)
    eid = table.find(key_bytes)
    if eid < 0:
        return False
    _, payload, _ = table.value_views(eid)
    if not payload.nbytes:
        return False
    view = payload.views[0]
    view[at % len(view)] ^= 0x5A
    return True


@compiled
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS,
    policy=st.sampled_from(sorted(POLICIES)),
    verify=st.sampled_from([None, False, True]),
    inline=st.sampled_from([0, 80, 128]),
)
def test_both_engines_give_the_same_answers_and_leave_the_same_segment(ops, policy, verify, inline):
    """Damaged payload bytes included: verified (all values, or by default those up to 16
    KiB), both drop the entry and count it damaged; unverified, both serve the damaged
    bytes. With inline slots (of 80 bytes: not whole cache lines, or 128), the smallest
    values lie in them."""
    clock = Ticks()
    with (
        new_pool(policy, clock, pure=False, verify_reads=verify, inline_bytes=inline) as fast,
        new_pool(policy, clock, pure=True, verify_reads=verify, inline_bytes=inline) as ref,
    ):
        for op, key, size, ttl in ops:
            if op == "tick":
                clock.now += 2.0  # past a ttl after three ticks: expired entries are Python's
                continue
            answers = []
            for pool in (fast, ref):
                if op == "put":
                    pool.put(key, bytes([size % 251]) * size, ttl=ttl)
                    answers.append(None)
                elif op == "get":
                    answers.append(pool.get(key))
                elif op == "get_into":
                    target = bytearray(70_000)
                    length = pool.get_into(key, target)
                    answers.append(None if length is None else bytes(target[:length]))
                elif op == "damage":
                    answers.append(flip_a_payload_byte(pool, key, size))
                elif op == "delete":
                    answers.append(pool.delete(key))
                else:
                    answers.append(key in pool)
            assert answers[0] == answers[1], (op, key)
        assert replace(fast.stats(), name="") == replace(ref.stats(), name="")
        assert_same_segment(fast, ref)


def assert_same_segment(
    fast: kvcache.Pool, ref: kvcache.Pool, unlike: tuple[str, ...] = ()
) -> None:
    """The two pools' segments hold the same words and pages (but the header words
    ``unlike``)."""
    a, b = fast._engine.views, ref._engine.views
    assert a.entries.tobytes() == b.entries.tobytes()  # hits touched alike, bit for bit
    assert a.index.tobytes() == b.index.tobytes()
    assert a.live.tobytes() == b.live.tobytes()
    assert a.page_next.tobytes() == b.page_next.tobytes()
    assert a.data.tobytes() == b.data.tobytes()
    assert a.ghost_q.tobytes() == b.ghost_q.tobytes()  # a queue policy's ghosts
    assert a.sketch.tobytes() == b.sketch.tobytes()  # a prefix pool's request counts
    for name in a.header.dtype.names:  # the allocator's, the clock, the regret sample...
        assert name in unlike or np.array_equal(a.header[name], b.header[name]), name


@compiled
def test_a_clean_miss_and_a_contains_run_no_python_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key certainly absent is answered in C (the miss counted in Python), and so is
    ``in`` for a plain hit; the Python probe (``Table.find``) stays for everything else."""
    with new_pool("lru", Ticks(), pure=False) as pool:
        pool.put("here", b"v" * 100)

        def python_probe(*args: object, **kwargs: object) -> int:
            raise AssertionError("the Python probe ran")

        monkeypatch.setattr(pool._engine.table, "find", python_probe)
        assert pool.get("absent") is None
        assert pool.get_into("absent", bytearray(10)) is None
        assert "here" in pool and "absent" not in pool
        assert pool.get("here") == b"v" * 100
        stats = pool.stats()
        assert (stats.hits, stats.misses) == (1, 2)
        monkeypatch.undo()


@compiled
@pytest.mark.parametrize("verify", [None, False, True])
@pytest.mark.parametrize("read", ["get", "get_into"])
def test_both_engines_answer_a_damaged_payload_byte_alike(verify: bool | None, read: str) -> None:
    """Verified, both engines drop a damaged value (in C or in Python, under the lock or
    outside it) as a counted damaged miss; unverified, both serve the damaged bytes. By
    default (None) every value is verified."""
    clock = Ticks()
    sizes = [1, 100, 1023, 3000, 16 << 10, (16 << 10) + 1, 70_000]
    verified = [verify is not False] * len(sizes)
    with (
        new_pool("lru", clock, pure=False, verify_reads=verify) as fast,
        new_pool("lru", clock, pure=True, verify_reads=verify) as ref,
    ):
        answers: dict[str, list[object]] = {"fast": [], "ref": []}
        for label, pool in (("fast", fast), ("ref", ref)):
            for size in sizes:
                pool.put(f"k{size}", bytes([size % 251]) * size)
                assert flip_a_payload_byte(pool, f"k{size}", size // 2)
            for size in sizes:
                if read == "get":
                    answers[label].append(pool.get(f"k{size}"))
                else:
                    target = bytearray(size)
                    answers[label].append(pool.get_into(f"k{size}", target) and bytes(target))
        assert answers["fast"] == answers["ref"]
        assert [answer is None for answer in answers["fast"]] == verified
        assert fast.stats().damaged == ref.stats().damaged == sum(verified)
        assert replace(fast.stats(), name="") == replace(ref.stats(), name="")
        assert fast._engine.views.entries.tobytes() == ref._engine.views.entries.tobytes()


@compiled
@pytest.mark.parametrize("half_life", [1, 3, 2**53 - 1, 2**53, 2**62])
def test_bug_a_half_life_past_2_53_refused_the_pool(half_life: int) -> None:
    """Regression: a Finder refused an lfu half-life of 2**53 and more (which the C code
    cannot divide by exactly), and so opening such a pool (a restored snapshot's
    header) raised ValueError. Now the pool opens and such a hit is touched in Python."""
    clock = Ticks()
    with (
        new_pool("lfu", clock, pure=False, lfu_half_life=half_life) as fast,
        new_pool("lfu", clock, pure=True, lfu_half_life=half_life) as ref,
    ):
        assert fast._engine.table.fast is not None
        for pool in (fast, ref):
            for key in KEYS:
                pool.put(key, b"v" * 100)
            for _ in range(3):
                assert [pool.get(key) for key in KEYS] == [b"v" * 100] * len(KEYS)
        assert fast._engine.views.entries.tobytes() == ref._engine.views.entries.tobytes()


C_FIELDS = [
    "generation",
    "state",
    "hash_lo",
    "hash_hi",
    "key_len",
    "header_len",
    "value_len",
    "first_page",
    "num_pages",
    "last_access",
    "freq",
    "expires_at",
    "flags",
    "checksum",
]
"""The entry words the C code reads."""


def damage_c_words(pool: kvcache.Pool, data: st.DataObject) -> None:
    """Overwrite one word the C code reads: an index slot, an entry field, a page link."""
    v = pool._engine.views
    target = data.draw(st.sampled_from(["entry", "entry", "index", "links"]))
    if target == "entry":
        eid = data.draw(st.integers(0, 15))
        name = data.draw(st.sampled_from(C_FIELDS))
        v.entries[name][eid] = word(data, ENTRY_DTYPE.fields[name][0].kind, v.entries[name][eid])  # type: ignore[index]
        return
    array = v.index if target == "index" else v.page_next
    slot = data.draw(st.integers(0, len(array) - 1))
    array[slot] = word(data, "i", array[slot])


def python_answer(pool: kvcache.Pool, key_bytes: bytes) -> int:
    """What the Python lookup's ``find`` says, or -2 where it raises."""
    table = pool._engine.table
    try:
        eid = table.index.find(*key_hash(key_bytes))
        return eid if eid >= 0 and table.stored_key(eid) == key_bytes else -1
    except (CorruptPoolError, IndexError, ValueError, OverflowError):
        return -2


def check_copies(engine, eid: int) -> None:
    """The C copies of entry ``eid``, verified or not, hold what the Python path reads, and
    a verified one is refused (False) exactly where the Python sum finds damage."""
    fast, raw = engine.table.fast, engine.views.raw
    try:
        _, payload, _ = engine.table.value_views(eid)
        expected, intact = payload.join(), engine.table.summed(eid).intact()
    except (CorruptPoolError, IndexError, ValueError, OverflowError):
        expected = intact = None  # damage the Python path reports: C declines or agrees
    for verify in (False, True):
        target = bytearray(1 << 16)
        copies = [
            fast.copy_value(raw, eid, 1 << 16, verify),
            fast.copy_into(raw, eid, target, 1 << 16, verify),
        ]
        if copies[1] is not None and copies[1] is not False:
            copies[1] = bytes(target[: copies[1]])
        for copied in copies:
            if copied is None or expected is None:
                continue
            if copied is False:
                assert verify and intact is False
            else:
                assert copied == expected and (intact or not verify)


@compiled
@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), inline=st.sampled_from([0, 80, 128]))
def test_damaged_words_give_the_python_answer_or_none_never_a_crash(data, inline) -> None:
    with damaged_pool("lru", inline) as pool:
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            damage_c_words(pool, data)
        engine = pool._engine
        fast, raw = engine.table.fast, engine.views.raw
        for key in [*VALUES, "absent"]:
            key_bytes, _ = encode_key(key)
            with engine.lock:
                eid = fast.find_hit(raw, key_bytes, engine.clock(), False)
                if eid == fastpath.ABSENT:  # a clean miss in C is a miss in Python, not damage
                    assert python_answer(pool, key_bytes) == -1
                if eid >= 0:  # a hit in C is a hit the Python lookup finds too
                    assert python_answer(pool, key_bytes) == eid
                    check_copies(engine, eid)
            try:
                got = pool.get(key)
            except CorruptPoolError:
                continue
            assert got is None or type(got) is type(VALUES[key]) or isinstance(got, bytes)


@compiled
@pytest.mark.parametrize("inline", [0, 256])
def test_a_pure_python_process_and_a_compiled_one_share_a_pool(inline: int) -> None:
    """With inline slots, the values of up to 200 bytes or so lie in them."""
    name = f"test-fastpath-{uuid.uuid4().hex[:10]}"
    pool = kvcache.create(name, "1M", page_size="1K", policy="lfu", inline_bytes=inline)
    code = (
        "import sys, kvcache\n"
        "from kvcache import native\n"
        "assert native.engine() == 'pure-python'\n"
        "pool = kvcache.open(sys.argv[1])\n"
        "for i in range(50):\n"
        "    assert pool.get(f'c{i}') == bytes([i]) * (100 * i), i\n"
        "    pool.put(f'p{i}', bytes([i + 1]) * (90 * i))\n"
        "pool.close()\n"
    )
    try:
        for i in range(50):
            pool.put(f"c{i}", bytes([i]) * (100 * i))
            assert pool.get(f"c{i}") == bytes([i]) * (100 * i)  # touched in C first
        subprocess.run(
            [sys.executable, "-c", code, name],
            env={**os.environ, "KVCACHE_PURE_PYTHON": "1"},
            check=True,
        )
        for i in range(50):
            assert pool.get(f"p{i}") == bytes([i + 1]) * (90 * i)
            assert pool.get(f"c{i}") == bytes([i]) * (100 * i)
        assert pool.stats().hits == 200
        assert pool.check() == []
    finally:
        pool.close()
        kvcache.destroy(name)


@compiled
def test_a_foreign_geometry_is_refused() -> None:
    with damaged_pool("lru") as pool:
        g = pool._engine.views.geometry
        half_life = pool._engine.config.lfu_half_life
        with pytest.raises(ValueError):
            fastpath.new_finder(
                replace(g, index_slots=g.index_slots + 1), half_life, fastpath.HIT_TOUCH
            )
        with pytest.raises(ValueError):
            fastpath.new_finder(
                replace(g, num_pages=g.num_pages * 2), half_life, fastpath.HIT_TOUCH
            )
        for inline_offset in (0, g.total_bytes - 64):  # slots nowhere, or past the mapping
            with pytest.raises(ValueError):
                fastpath.new_finder(
                    replace(g, inline_bytes=128, inline_offset=inline_offset),
                    half_life,
                    fastpath.HIT_TOUCH,
                )
        short = np.zeros(g.total_bytes - 1, np.uint8)
        table = pool._engine.table
        assert table.fast.find_hit(memoryview(short), b"small", 0.0, True) == -1
        assert table.fast.copy_value(memoryview(short), 0, 1 << 16, True) is None
        assert table.fast.copy_into(memoryview(short), 0, bytearray(8), 1 << 16, True) is None


QUEUE_ENTRY_WORDS = ["probation", "queue_prev", "queue_next", "reads", "last_access", "freq"]


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), policy=st.sampled_from(["s3fifo", "arc", "prefix"]))
def test_a_damaged_queue_hit_in_c_writes_what_python_writes_or_is_left_to_it(data, policy):
    """A queue policy's hit on damaged lists: where C takes it (an id, not -1), the Python
    lookup on the same bytes takes it too, answers the same entry and leaves the segment
    byte for byte as C left it; elsewhere C wrote nothing."""
    with damaged_pool(policy) as pool:
        engine = pool._engine
        v, fast, raw = engine.views, engine.table.fast, engine.views.raw
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            if data.draw(st.booleans(), label="a queue word"):
                eid, name = (
                    data.draw(st.integers(0, 15)),
                    data.draw(st.sampled_from(QUEUE_ENTRY_WORDS)),
                )
                kind = ENTRY_DTYPE.fields[name][0].kind
                v.entries[name][eid] = word(data, kind, v.entries[name][eid])  # type: ignore[index]
            elif data.draw(st.booleans(), label="a header word"):
                name = data.draw(st.sampled_from(QUEUE_WORDS))
                v.header[name] = word(data, "i", v.header[name])
            else:
                damage_c_words(pool, data)
        now = engine.clock()
        for key in VALUES:
            key_bytes, _ = encode_key(key)
            with engine.lock:
                before = bytes(raw)
                eid = fast.find_hit(raw, key_bytes, now, True)
                if eid < 0:
                    assert bytes(raw) == before  # declined: nothing written
                    continue
                by_c = bytes(raw)
                raw[:] = before
                engine.table.fast, engine.table.clock = None, lambda: now
                try:
                    assert engine.table.lookup(key_bytes, count=True) == eid
                finally:
                    engine.table.fast, engine.table.clock = fast, engine.clock
                assert bytes(raw) == by_c


def c_writes_what_python_writes(
    raw: memoryview, compiled: Callable[[], object], python: Callable[[], object]
) -> bool:
    """Run ``compiled`` on the segment ``raw``; where it declines (a falsy answer) it must
    have written nothing; where it takes the work, ``python`` run on the bytes as they were
    must leave the same bytes. Whether C took it."""
    before = bytes(raw)
    if not compiled():
        assert bytes(raw) == before  # declined: nothing written
        return False
    by_c = bytes(raw)
    raw[:] = before
    python()
    assert bytes(raw) == by_c
    return True


PUT_HEADER_WORDS = [
    "num_free_pages",
    "free_page_head",
    "next_fresh_page",
    "reserved_pages",
    "used_pages",
    "free_entry_head",
    "next_fresh_entry",
    "num_live",
    "puts",
    "next_expiry_at",
    "clock",
    "regret_accesses_sum",
]
"""The header words a compiled put reads or writes (besides the regret ring)."""
PUT_ENTRY_WORDS = ["state", "live_pos", "last_page", "num_pages", "first_page", "next_free"]


def damage_put_words(pool: kvcache.Pool, data: st.DataObject, sampled: list[bytes]) -> None:
    """Overwrite one word a put follows or changes, or plant a regret record (damaged or
    not) for one of the ``sampled`` keys, so that its put counts the regret."""
    v = pool._engine.views
    target = data.draw(st.sampled_from(["header", "entry", "live", "regret", "other"]))
    if target == "header":
        name = data.draw(st.sampled_from(PUT_HEADER_WORDS))
        v.header[name] = word(data, HEADER_DTYPE.fields[name][0].kind, v.header[name])  # type: ignore[index]
    elif target == "entry":
        eid, name = data.draw(st.integers(0, 15)), data.draw(st.sampled_from(PUT_ENTRY_WORDS))
        v.entries[name][eid] = word(data, "i", v.entries[name][eid])
    elif target == "live":
        at = data.draw(st.integers(0, 15))
        v.live[at] = word(data, "i", v.live[at])
    elif target == "regret":
        ring = v.header["regret_ring"]
        at = data.draw(st.integers(0, 63)) * 3
        ring[at] = key_hash(data.draw(st.sampled_from(sampled)))[0] | 1
        ring[at + 2] = data.draw(st.integers(0, 50) | st.integers(-(2**63), 2**63 - 1))
        ring[at + 1] = np.float64(data.draw(st.floats())).view(np.int64)
    else:
        damage_c_words(pool, data)


PutCall = tuple[bytes, object, bytes]
"""A compiled put's call: the segment before, its answer, the segment after."""


def record_compiled_puts(pool: kvcache.Pool) -> tuple[list[PutCall], Callable[..., object]]:
    """Freeze ``pool``'s clock and its latency samples (a sample writes the metrics region),
    and a stand-in for its compiled ``put`` that records each call (``PutCall``), with the
    list it records into."""
    engine = pool._engine
    fast_put, now = engine._put, engine.clock()
    pool._puts_left = 1 << 30
    engine.clock = engine.table.clock = engine.evictor._clock = lambda: now
    calls: list[PutCall] = []

    def recorded(mapping, *args):  # type: ignore[no-untyped-def]
        before = bytes(mapping)
        answer = fast_put(mapping, *args)
        calls.append((before, answer, bytes(mapping)))
        return answer

    return calls, recorded


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), inline=st.sampled_from([0, 128]))
def test_a_compiled_put_writes_what_python_writes_or_nothing(data, inline) -> None:
    """A put on damaged words: where C takes it (answers a checksum), the Python put on the
    same bytes succeeds and leaves the segment byte for byte as C left it; where C declines
    it wrote nothing. With inline slots, the values of 0 and 1 bytes go there."""
    with damaged_pool("lru", inline) as pool:
        engine = pool._engine
        raw = engine.views.raw
        compiled_halves = engine._reserve_compiled, engine._publish_compiled
        mask = (1 << sample_shift(engine.views.geometry.max_entries)) - 1
        sampled = [k for k in (f"new{i}".encode() for i in range(200)) if not key_hash(k)[1] & mask]
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            damage_put_words(pool, data, sampled[:4])
        calls, recorded = record_compiled_puts(pool)
        for key in [*VALUES, *sampled[:4]]:
            size = data.draw(st.sampled_from([0, 1, 1000, 3000]), label="value bytes")
            value = bytes([size % 251]) * size
            start = bytes(raw)
            engine._put = recorded
            calls.clear()
            with contextlib.suppress(CorruptPoolError):
                pool.put(key, value)
            for before, answer, after in calls:  # lock busy, no room, or left to Python
                assert (answer is not None and answer >= 0) or after == before
            before, answer, after = calls[-1]
            if answer is None:
                continue
            by_c = bytes(raw)
            raw[:] = start
            engine._put = engine._reserve_compiled = engine._publish_compiled = None
            pool.put(key, value)  # Python takes it too: C checked what Python would raise on
            engine._reserve_compiled, engine._publish_compiled = compiled_halves
            assert bytes(raw) == by_c


QUEUE_POLICIES = sorted(fastpath.QUEUE_POLICIES)
CHAIN_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "put", "get", "delete"]),
        st.integers(0, 31),  # the key
        st.none() | st.integers(0, 31),  # its parent (a prefix pool's; others ignore it)
        # 30 KB values fill the 256 KiB pool; 70 KB ones are copied without the lock
        st.sampled_from([0, 100, 3000, 30_000, 70_000]),
    ),
    max_size=100,
)


@compiled
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=CHAIN_OPS, policy=st.sampled_from(QUEUE_POLICIES), inline=st.sampled_from([0, 128]))
def test_a_queue_pools_puts_in_c_leave_what_pythons_leave(ops, policy, inline) -> None:
    """Puts of new keys (their ghosts recalled or not) and over old ones, in a ``prefix``
    pool under parents held, absent or below the key itself, with gets and deletes between
    and the pool filling up (its evictions are Python's): both engines answer alike and
    leave the same segment, ghosts and request counts included."""
    clock = Ticks()
    with (
        new_pool(policy, clock, pure=False, inline_bytes=inline) as fast,
        new_pool(policy, clock, pure=True, inline_bytes=inline) as ref,
    ):
        for pool in (fast, ref):  # full, with ghosts, then room: recalls in C
            for i in range(12):
                pool.put(f"k{i}", b"p" * 30_000, parent=f"k{i - 1}" if i % 3 else None)
            for i in range(8, 12):
                pool.delete(f"k{i}")
        for op, key, parent, size in ops:
            answers = []
            for pool in (fast, ref):
                if op == "put":
                    above = None if parent is None else f"k{parent}"
                    pool.put(f"k{key}", bytes([size % 251]) * size, parent=above)
                    answers.append(f"k{key}" in pool)
                elif op == "get":
                    answers.append(pool.get(f"k{key}"))
                else:
                    answers.append(pool.delete(f"k{key}"))
            assert answers[0] == answers[1], (op, key)
        assert replace(fast.stats(), name="") == replace(ref.stats(), name="")
        assert_same_segment(fast, ref)


@compiled
@pytest.mark.parametrize("policy", QUEUE_POLICIES)
def test_a_queue_pools_puts_are_taken_in_c(policy: str) -> None:
    """A queue policy's puts of new keys, of chunks under their parents and over old keys
    are all taken in C, into a pool with room and into a full one (its evictions too); a
    key put again while its ghost is remembered, once room is free, is recalled in C: it
    goes to main."""
    with new_pool(policy, Ticks(), pure=False) as pool:
        engine = pool._engine
        pool.put("first", b"f" * 1000)  # reserves the pool's memory (in Python: a system call)
        answers: list[object] = []
        put = engine._put

        def recorded(*args):  # type: ignore[no-untyped-def]
            answers.append(put(*args))
            return answers[-1]

        engine._put = recorded
        for again in (False, True):
            for i in range(20):
                pool.put(f"c{i}", b"w" * (500 + again), parent=f"c{i - 1}" if i else None)
        assert len(answers) == 40 and all(a is not None and a >= 0 for a in answers)
        assert len(pool) == 21
        answers.clear()
        for i in range(300):  # a 256 KiB pool: these evict
            pool.put(f"fill{i}", b"f" * 3000)
        assert len(answers) == 300 and all(a is not None and a >= 0 for a in answers)
        assert pool.stats().evictions >= 200
        ghosts = engine.table.queues.ghosts
        gone = [f"fill{i}" for i in range(300) if f"fill{i}" not in pool]
        lo = key_hash(gone[-1].encode())[0]
        with engine.lock:
            kind = ghosts.remove(lo)  # remembered (asked here, so put back)
            assert kind >= 0
            ghosts.add(lo, kind)
        for key in list(pool)[:4]:
            pool.delete(key)
        answers.clear()
        pool.put(gone[-1], b"back" * 10)
        assert answers[-1] is not None and answers[-1] >= 0
        eid = engine.table.find(gone[-1].encode())
        assert engine.views.entries["probation"][eid] == 0  # recalled: to main


PROMPTS = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), min_size=3, max_size=12)),
    min_size=20,
    max_size=120,
)
"""Prompts as (system prompt, branch choices): each chunk's key names its whole prefix, so
prompts share their chunks as far as their choices agree (shared chunks earn credits,
chunks asked for again are counted)."""


@compiled
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompts=PROMPTS, policy=st.sampled_from(QUEUE_POLICIES))
def test_prompt_traffic_evicts_in_c_as_in_python(prompts, policy) -> None:
    """Prompts replayed as ``simulate`` replays them (each reads its chunks up to the first
    miss and puts the rest, each under the one before) into a pool that holds a fraction of
    them, so that most puts evict in C: victims by the policy (``prefix``'s admission by
    counts, credits and age rule; S3-FIFO's and ARC's queues), ghosts, chains of chunks.
    Both engines answer alike and leave the same segment."""
    clock = Ticks()
    with (
        new_pool(policy, clock, pure=False) as fast,
        new_pool(policy, clock, pure=True) as ref,
    ):
        for system, choices in prompts:
            keys = [
                f"s{system}:" + ".".join(map(str, choices[: i + 1])) for i in range(len(choices))
            ]
            for pool in (fast, ref):
                read = 0
                while read < len(keys) and pool.get(keys[read]) is not None:
                    read += 1
                for i in range(read, len(keys)):
                    pool.put(keys[i], b"c" * 6000, parent=keys[i - 1] if i else None)
            assert [k in fast for k in keys] == [k in ref for k in keys]
        assert replace(fast.stats(), name="") == replace(ref.stats(), name="")
        assert_same_segment(fast, ref)


@compiled
def test_prefix_evicts_probations_oldest_before_a_more_recent_main_chunk_in_c() -> None:
    """``prefix``'s age rule through the compiled eviction: with probation below its target
    (every chunk but the first read once, so in main), the victim would be main's least
    recently used, but probation's oldest, unread since long before, goes first. Both
    engines evict the same chunks and leave the same segment."""
    clock = Ticks()
    with (
        new_pool("prefix", clock, pure=False) as fast,
        new_pool("prefix", clock, pure=True) as ref,
    ):
        for pool in (fast, ref):
            pool.put("old", b"o" * 6000)
            for i in range(100):
                pool.put(f"k{i}", b"c" * 6000)
                assert pool.get(f"k{i}") is not None
        assert "old" not in fast and "old" not in ref  # gone first, though put first of all
        assert fast.stats().evictions == ref.stats().evictions > 50
        assert_same_segment(fast, ref)


QUEUE_DAMAGE_HEADER_WORDS = [
    *QUEUE_WORDS,
    "ghost_next",
    "ghost_tail_probation",
    "ghost_tail_main",
    "num_ghosts_probation",
    "num_ghosts_main",
    "probation_target",
    "last_admitted",
    "sketch_counted",
    "num_live",
]
"""The header words a queue policy's put reads or writes."""
TREE_WORDS = ["parent", "first_child", "next_sibling", "prev_sibling", "depth"]


def damage_queue_words(pool: kvcache.Pool, data: st.DataObject) -> None:
    """Overwrite one word a queue policy's put follows: an entry's list, tree or reads word,
    a header word of the queues or ghosts, a word of the ghost ring."""
    v = pool._engine.views
    target = data.draw(st.sampled_from(["entry", "header", "ghosts"]))
    if target == "entry":
        eid = data.draw(st.integers(0, 15))
        name = data.draw(st.sampled_from([*QUEUE_ENTRY_WORDS, *TREE_WORDS]))
        kind = ENTRY_DTYPE.fields[name][0].kind
        v.entries[name][eid] = word(data, kind, v.entries[name][eid])  # type: ignore[index]
    elif target == "header":
        name = data.draw(st.sampled_from(QUEUE_DAMAGE_HEADER_WORDS))
        kind = HEADER_DTYPE.fields[name][0].kind
        v.header[name] = word(data, kind, v.header[name])  # type: ignore[index]
    else:
        ring = np.frombuffer(v.ghost_q, np.int64)
        at = data.draw(st.integers(0, len(ring) - 1))
        ring[at] = word(data, "i", ring[at])


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), policy=st.sampled_from(QUEUE_POLICIES))
def test_a_compiled_queue_put_writes_what_python_writes_or_nothing(data, policy) -> None:
    """A queue policy's put on damaged lists, ghosts, tree or counts, with room or evicting:
    where C takes it (a checksum), the Python put on the same bytes succeeds and leaves the
    segment byte for byte as C left it; where C declines, it wrote nothing (its journal
    undone)."""
    with damaged_pool(policy) as pool:
        engine = pool._engine
        raw = engine.views.raw
        for key in ("gone1", "gone2"):  # ghosts to recall
            pool.put(key, b"g" * 10)
            lo = key_hash(key.encode())[0]
            pool.delete(key)
            with engine.lock:
                engine.table.queues.ghosts.add(lo, data.draw(st.sampled_from([0, 1])))
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            if data.draw(st.booleans(), label="a queue word"):
                damage_queue_words(pool, data)
            else:
                damage_put_words(pool, data, [b"new"])
        calls, recorded = record_compiled_puts(pool)
        keys = [*VALUES, "gone1", "gone2", "new"]
        for key in keys:  # 60 KB values fill the pool: their puts evict
            size = data.draw(st.sampled_from([0, 1000, 3000, 60_000]), label="value bytes")
            parent = data.draw(st.none() | st.sampled_from(keys), label="parent")
            value = bytes([size % 251]) * size
            start = bytes(raw)
            engine._put = recorded
            calls.clear()
            with contextlib.suppress(CorruptPoolError):
                pool.put(key, value, parent=parent)
            for before, answer, after in calls:  # lock busy, no room, or left to Python
                assert (answer is not None and answer >= 0) or after == before
            if not calls or calls[-1][1] is None or calls[-1][1] < 0:
                continue
            by_c = bytes(raw)
            raw[:] = start
            compiled = engine._reserve_compiled, engine._publish_compiled
            engine._put = engine._reserve_compiled = engine._publish_compiled = None
            pool.put(key, value, parent=parent)  # Python takes it too, and writes the same
            engine._reserve_compiled, engine._publish_compiled = compiled
            assert bytes(raw) == by_c


@compiled
def test_bug_a_put_over_a_key_whose_list_word_lies_unlinked_its_old_entry_as_python_does() -> None:
    """The fuzz found it: an entry of main whose list word says probation, put again in an
    ``arc`` pool. The new entry takes its place in the wrong list, the hit pushes it onto
    main's head, which still names the old entry, and so links the old entry back in; the
    Python put then unlinks it as it removes it. C left it linked (it took the old entry to
    be out of every list by then); it unlinks it as Python does now."""
    with damaged_pool("arc") as pool:
        engine = pool._engine
        views, raw = engine.views, engine.views.raw
        eid = engine.table.find(b"small")
        assert views.entries["probation"][eid] == 0 and views.header["main_head"] == eid + 1
        views.entries["probation"][eid] = 1
        pool._puts_left = 1 << 30  # no latency sample: it writes the metrics region
        now = engine.clock()
        engine.clock = engine.table.clock = lambda: now
        start = bytes(raw)
        pool.put("small", b"")
        by_c = bytes(raw)
        raw[:] = start
        engine._put = engine._reserve_compiled = engine._publish_compiled = None
        pool.put("small", b"")
        assert bytes(raw) == by_c


@compiled
def test_bug_a_put_claiming_an_entry_that_a_damaged_index_slot_names_was_taken_in_c() -> None:
    """The fuzz found it: an index slot on a new key's probe, overwritten to name the free
    entry that the put claims, is passed over by C's probe before the claim (that entry's
    hash is another's), but Python's publish looks the key up again after reserve wrote its
    hash there, finds that entry first and fails on it. C took such a put; it declines it
    now, having written nothing, and the Python put reports the damage."""
    with damaged_pool("lru") as pool:
        engine = pool._engine
        views, raw = engine.views, engine.views.raw
        free = views.header_q[H.free_entry_head] - 1  # "gone", deleted by the fill
        assert free >= 0
        mask = views.geometry.index_slots - 1
        key = next(
            k
            for k in (f"new{i}".encode() for i in range(1000))
            if not views.index[key_hash(k)[0] & mask]
        )
        views.index[key_hash(key)[0] & mask] = free + 1
        before = bytes(raw)
        with engine.lock:
            answer = engine._put(
                raw, key, 0, b"", b"v", 0, math.inf, 0.0, engine.slot, engine.serial
            )
        assert answer is None and bytes(raw) == before
        engine._put = None
        with pytest.raises(CorruptPoolError):
            pool.put(key, b"v")


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), inline=st.sampled_from([0, 128]))
def test_a_compiled_eviction_writes_what_python_writes_or_nothing(data, inline) -> None:
    """``evict`` of each entry of a damaged pool: where C takes it, Python's ``evict_one`` on
    the same bytes succeeds and leaves the same segment; where C declines it wrote nothing."""
    with damaged_pool("lru", inline) as pool:
        engine = pool._engine
        raw, evictor, now = engine.views.raw, engine.evictor, engine.clock()
        evict = evictor._evict
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            damage_put_words(pool, data, [b"small"])
        evictor._clock = lambda: now

        def python_evicts(eid: int) -> None:
            evictor._evict = None
            try:
                assert evictor.evict_one(eid) == 1
            finally:
                evictor._evict = evict

        for eid in range(-1, 17):
            with engine.lock:
                c_writes_what_python_writes(
                    raw,
                    functools.partial(evict, raw, eid, now),
                    functools.partial(python_evicts, eid),
                )


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), inline=st.sampled_from([0, 128]))
def test_a_compiled_delete_writes_what_python_writes_or_nothing(data, inline) -> None:
    """``delete`` of each key of a damaged pool (and of one never put): where C removes the
    entry, Python's find and remove on the same bytes succeed and leave the same segment;
    where C answers absent or declines, it wrote nothing."""
    with damaged_pool("lru", inline) as pool:
        engine = pool._engine
        raw, table, delete = engine.views.raw, engine.table, engine._delete
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            damage_put_words(pool, data, [b"small"])

        def python_deletes(key_bytes: bytes) -> None:
            eid = table.find(key_bytes)
            assert eid >= 0
            table.remove(eid)

        for key in [*VALUES, "absent"]:
            key_bytes, _ = encode_key(key)
            with engine.lock:
                c_writes_what_python_writes(
                    raw,
                    functools.partial(delete, raw, key_bytes),
                    functools.partial(python_deletes, key_bytes),
                )


@compiled
@DAMAGE_SETTINGS
@given(data=st.data(), policy=st.sampled_from(["lru", *QUEUE_POLICIES]))
def test_a_large_put_reserved_and_published_in_c_writes_what_python_writes(data, policy) -> None:
    """A put too large to copy under the lock, reserved and then published on damaged
    words: each half that C takes leaves the bytes Python's half leaves on the same
    segment, and each it declines wrote nothing. In a queue policy's pool, with its lists,
    ghosts, tree and counts damaged too: a new key's ghost recalled by the reserve, the
    entry queued (in a ``prefix`` pool under a parent held or not) by the publish."""
    with damaged_pool(policy) as pool:
        engine = pool._engine
        raw, now, table = engine.views.raw, engine.clock(), engine.table
        reserve, publish = engine._reserve_compiled, engine._publish_compiled
        if table.queues is not None:  # a ghost to recall
            pool.put("gone", b"g" * 10)
            pool.delete("gone")
            with engine.lock:
                table.queues.ghosts.add(key_hash(b"gone")[0], data.draw(st.sampled_from([0, 1])))
        table.clock = lambda: now
        key = data.draw(st.sampled_from([b"small", b"new-key", b"gone"]), label="key")
        parent = data.draw(st.sampled_from([None, b"pages", b"small", b"absent"]), label="parent")
        args = (0, 0, 70_000, 0, math.inf)

        def damage() -> None:
            for _ in range(data.draw(st.integers(0, 3), label="words")):
                if table.queues is not None and data.draw(st.booleans(), label="a queue word"):
                    damage_queue_words(pool, data)
                else:
                    damage_put_words(pool, data, [b"new-key"])

        damage()
        pages = -(-(len(key) + 70_000) // table.page_size)
        reserved: list[int] = []

        def c_reserves() -> bool:
            eid = reserve(raw, key, *args, now, engine.slot, engine.serial, parent)
            reserved.extend([] if eid is None else [eid])
            return eid is not None

        def python_reserves() -> None:
            eid = table.reserve(0, key, 0, 70_000, pages, 0, math.inf, True, parent=parent)
            assert eid == reserved[0]

        def python_publishes() -> None:
            table.views.entries_q[reserved[0] * ENTRY_WORDS + E.checksum] = 12345
            assert table.publish(reserved[0], parent=parent)

        with engine.lock:
            if not c_writes_what_python_writes(raw, c_reserves, python_reserves):
                return
        damage()
        with engine.lock:
            c_writes_what_python_writes(
                raw, lambda: publish(raw, reserved[0], 12345, now, parent), python_publishes
            )


@compiled
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(sorted(fastpath.RANK_KINDS)),
    samples=st.sampled_from([1, 8, 64]),
    inline=st.sampled_from([0, 128]),
    seed=st.integers(0, 2**32),
)
def test_a_full_pools_eviction_rounds_in_c_leave_what_pythons_leave(policy, samples, inline, seed):
    """Puts into a full pool of a policy ranked in C, each engine drawing its samples with
    the same random words: the compiled rounds of eviction (the request, the sample, its
    ranking, the victims; a due tidy first, expired entries included) leave the segment the
    Python rounds leave, byte for byte, and take every round of a healthy pool."""
    clock, rng = Ticks(), np.random.default_rng(seed)
    with (
        new_pool(policy, clock, pure=False, inline_bytes=inline, eviction_samples=samples) as fast,
        new_pool(policy, clock, pure=True, inline_bytes=inline, eviction_samples=samples) as ref,
    ):
        rounds: list[object] = []
        evictor = fast._engine.evictor
        make_room = evictor._make_room
        evictor._make_room = lambda *args: rounds.append(make_room(*args)) or rounds[-1]
        for pool in (fast, ref):
            pool._engine.evictor._rng = np.random.default_rng(seed)
        for i in range(1000):
            key = f"k{rng.integers(600)}"
            size = int(rng.choice([10, 100, 900, 2500]))
            ttl = 3.0 if rng.random() < 0.05 else None
            priority, read = int(rng.integers(5)), f"k{rng.integers(600)}"
            for pool in (fast, ref):
                pool.put(key, bytes([i % 251]) * size, ttl=ttl, priority=priority)
                pool.get(read)
            clock.now += 0.25
        assert rounds and all(left == [] for left in rounds)
        assert replace(fast.stats(), name="") == replace(ref.stats(), name="")
        assert_same_segment(fast, ref)


@compiled
@DAMAGE_SETTINGS
@given(
    data=st.data(),
    inline=st.sampled_from([0, 128]),
    policy=st.sampled_from(sorted(fastpath.RANK_KINDS)),
)
def test_a_compiled_eviction_round_writes_what_python_writes_or_nothing(data, inline, policy):
    """``make_room`` on damaged words: where C declines (None) it wrote nothing; where it
    answers the victims it left, Python's round on the same bytes (the request, the sample
    drawn and ranked by numpy, each victim evicted the Python way) evicts the victims C
    evicted first, leaving the same segment, and then the ones C left, in C's order."""
    with damaged_pool(policy, inline) as pool:
        engine = pool._engine
        raw, evictor, table, now = engine.views.raw, engine.evictor, engine.table, engine.clock()
        for _ in range(data.draw(st.integers(1, 4), label="words")):
            damage_put_words(pool, data, [b"small", b"new-key"])
        evictor._clock = table.clock = lambda: now
        key = data.draw(st.sampled_from([None, b"small", b"new-key"]), label="key")
        num_pages = data.draw(st.sampled_from([0, 1, 1 << 20]), label="pages")
        top = data.draw(st.integers(1, 4), label="top")
        words = np.array(
            data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=top, max_size=4 * top)),
            np.uint64,
        )
        with engine.lock:
            before = bytes(raw)
            left = evictor._make_room(key, num_pages, words, top, now)
            if left is None:
                assert bytes(raw) == before
                return
            by_c, raw[:] = bytes(raw), before
            evictor._evict = None
            if key is not None:
                table.request(key)
            victims: list[int] = []
            if not evictor.has_room(num_pages):
                live = engine.views.live[: engine.views.header_q[H.num_live]]
                ids = live[words % np.uint64(live.size)]
                records = engine.views.entries
                columns = {n: records[n][ids] for n in (*RANKING_FIELDS, *table.policy.fields)}
                victims = ids[rank_victims(table.policy, columns, evictor.score_context(), top=top)]
            taken = list(victims)[: len(victims) - len(left)]
            assert list(victims)[len(taken) :] == left
            for eid in taken:
                if engine.views.entries_q[eid * ENTRY_WORDS + E.state] == READY:
                    evictor.evict_one(eid)
            assert bytes(raw) == by_c


@compiled
def test_a_round_stops_at_a_victim_it_cannot_follow_and_leaves_the_rest_to_python() -> None:
    """A victim whose record no longer matches its index slot (a damaged key hash): the
    round evicts the victims ranked before it and answers it and those after it, in order,
    for Python's eviction to judge."""
    with damaged_pool("lru") as pool:
        engine = pool._engine
        views, evictor = engine.views, engine.evictor
        live = views.live[: views.header_q[H.num_live]].copy()
        words = np.arange(live.size, dtype=np.uint64)  # the sample: every live entry once
        with engine.lock:
            order = engine.evictor._rank(live, live.size, engine.clock())
            victims = live[order].tolist()
            views.entries["hash_lo"][victims[2]] ^= 1  # another home slot
            left = evictor._make_room(None, 1 << 20, words, live.size, 0.0)
        assert left == victims[2:]
        states = views.entries["state"]
        assert (states[victims[:2]] == 0).all() and (states[victims[2:]] == READY).all()


@compiled
@pytest.mark.parametrize("inline", [0, 128])
def test_a_healthy_pools_puts_and_evictions_are_all_taken_in_c(inline: int) -> None:
    """Small and large puts of new keys and over old ones, and the rounds of eviction that
    make room in a full pool (a sample drawn, ranked and its best evicted): C takes every
    one once the pool's memory is reserved (the damage tests above only hold C to what it
    takes). With inline slots, the filling values lie in them: room is then an entry slot,
    not pages."""
    with new_pool("lru", Ticks(), pure=False, inline_bytes=inline) as pool:
        engine = pool._engine
        pool.put("first", b"f" * 1000)  # reserves the pool's memory (in Python: a system call)
        answers: dict[str, list[object]] = {}

        def recording(name: str, call):  # type: ignore[no-untyped-def]
            def recorded(*args):  # type: ignore[no-untyped-def]
                answers.setdefault(name, []).append(call(*args))
                return answers[name][-1]

            return recorded

        engine._put = recording("put", engine._put)
        engine._reserve_compiled = recording("reserve", engine._reserve_compiled)
        engine._publish_compiled = recording("publish", engine._publish_compiled)
        engine.evictor._evict = recording("evict", engine.evictor._evict)
        engine.evictor._make_room = recording("make_room", engine.evictor._make_room)
        engine._delete = recording("delete", engine._delete)
        for key in ("a", "b", "a"):
            pool.put(key, b"s" * 3000)
            pool.put(key + "-large", b"L" * 70_000)
        assert pool.delete("b") and not pool.delete("b") and pool.delete("b-large")
        taken = {name: [a is not None for a in got] for name, got in answers.items()}
        assert taken == {
            "put": [True] * 3,
            "reserve": [True] * 3,
            "publish": [True] * 3,
            "delete": [True] * 3,  # removed, absent, removed
        }
        answers["put"].clear()
        for i in range(300):  # a 256 KiB pool: these evict, ranking samples of 64
            pool.put(f"fill{i}", b"f" * 100)
        inline_entries = (
            pool._engine.views.entries["num_pages"][pool._engine.views.live[: len(pool)]] == 0
        )
        assert inline_entries.all() if inline else not inline_entries.any()
        # where C found no room, Python made it and C put the value after all
        assert fastpath.NO_ROOM in answers["put"] and None not in answers["put"]
        assert sum(a >= 0 for a in answers["put"]) == 300
        # every round of eviction in C whole (a due tidy first in Python), none left over
        assert pool.stats().evictions and answers["make_room"]
        assert all(left == [] for left in answers["make_room"])


@compiled
@pytest.mark.parametrize("in_the_way", IN_THE_WAY)
def test_a_put_takes_a_free_lock_word_itself_and_leaves_anything_else_to_the_lock(
    in_the_way: str,
) -> None:
    """A small put passes the lock's owner word and takes the lock in C where it is free:
    the word and ``dirty`` are zero after, as after a hold of the Python lock. Where the
    word is held, a flock-only process is counted, a holder died mid-way or the pool is
    retired, C answers ``LOCK_BUSY`` having written nothing, for the lock to decide."""
    with new_pool("lru", Ticks(), pure=False) as pool:
        engine = pool._engine
        pool.put("first", b"")  # reserves the pool's memory (in Python: a system call)
        header, raw, word = engine.views.header_q, engine.views.raw, engine.lock.word
        assert word  # this process locks by the word
        args = (b"key", 0, b"", memoryview(b"v" * 100), 0, math.inf, 0.0, engine.slot, 1)
        assert engine._put(raw, *args, word) not in (None, fastpath.LOCK_BUSY)
        assert header[H.lock_word] == header[H.dirty] == 0
        with word_in_the_way(engine, in_the_way):
            before = bytes(raw)
            assert engine._put(raw, *args, word) == fastpath.LOCK_BUSY
            assert bytes(raw) == before


@pytest.mark.parametrize("pure", [False, True])
def test_a_key_put_again_into_a_full_pool_counts_its_regret_before_room_is_made(pure: bool):
    """The regret ring's oldest record names a key that is put again into a full pool: its
    gap is counted before the eviction that makes room overwrites the record, in C (where
    Python makes the room and asks for the key first) as in Python."""
    with new_pool("lru", Ticks(), pure=pure) as pool:
        engine = pool._engine
        header = engine.views.header_q
        mask = (1 << sample_shift(engine.views.geometry.max_entries)) - 1
        keys = [k for k in (f"key{i}".encode() for i in range(2000)) if not key_hash(k)[1] & mask]
        for key in keys[:110]:  # 7 KiB values: 36 live at most, ranked exactly; 74 evicted
            pool.put(key, b"v" * 7000)
        oldest = H.regret_ring + header[H.regret_next] % 64 * 3
        (again,) = [k for k in keys[:110] if key_hash(k)[0] | 1 == header[oldest]]
        counted = sum(header[H.regret_seconds + i] for i in range(25))
        answers: list[object] = []
        if not pure:
            put = engine._put
            engine._put = lambda *args: answers.append(put(*args)) or answers[-1]
        pool.put(again, b"v" * 7000)
        assert sum(header[H.regret_seconds + i] for i in range(25)) == counted + 1
        assert pure or (fastpath.NO_ROOM in answers and answers[-1] >= 0)  # type: ignore[operator]


@compiled
@settings(max_examples=200, deadline=None)
@given(
    live=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=50),
    words=st.lists(st.integers(0, 2**64 - 1), max_size=100),
)
def test_a_sample_is_drawn_in_c_as_numpy_draws_it(live: list[int], words: list[int]) -> None:
    """``draw`` is numpy's ``live[words % live.size]``, any live word (damaged) included."""
    live_ids, raw = np.array(live, np.int64), np.array(words, np.uint64)
    ids = np.full(raw.size, 7, np.int64)
    native.draw(live_ids, raw, ids)
    assert ids.tolist() == live_ids[raw % np.uint64(live_ids.size)].tolist()


RANKED_FIELD_VALUES = {
    "last_access": st.integers(-5, 5) | st.integers(-(2**63), 2**63 - 1),
    "created": st.integers(-5, 5) | st.integers(-(2**63), 2**63 - 1),
    "priority": st.integers(-3, 3) | st.integers(-(2**63), 2**63 - 1),
    "num_pages": st.integers(0, 4) | st.integers(-(2**63), 2**63 - 1),
    "expires_at": st.sampled_from([math.inf, -math.inf, math.nan, 0.0, -0.0, 999.0, 1000.0])
    | st.floats(),
}


@compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(sorted(fastpath.RANK_KINDS)),
    records=st.lists(st.fixed_dictionaries(RANKED_FIELD_VALUES), min_size=1, max_size=12),
    draws=st.lists(st.integers(0, 11), min_size=2, max_size=80),
    top=st.integers(1, 16),
)
@example(  # fewer keys than top that are not NaN: numpy's cut keeps only those
    policy="ttl",
    records=[{**dict.fromkeys(RANKED_FIELD_VALUES, 0), "expires_at": math.nan}] * 2
    + [{**dict.fromkeys(RANKED_FIELD_VALUES, 0), "expires_at": 2000.0}],
    draws=[0, 1, 2, 0, 1],
    top=3,
)
def test_a_sample_is_ranked_in_c_as_numpy_ranks_it(policy, records, draws, top) -> None:
    """Ties (broken by the last access, then the draw's place), expired entries first,
    NaN and infinite expiries, ints past 2**53: the best ``top`` as ``rank_victims``
    has them, and an id out of range is left to numpy."""
    from kvcache.policies import rank_victims
    from kvcache.policies.base import ScoreContext

    with new_pool(policy, Ticks(), pure=False) as pool:
        v = pool._engine.views
        for eid, record in enumerate(records):
            for name, value in record.items():
                v.entries[name][eid] = value
        ids = np.array([d % len(records) for d in draws], np.int64)
        if top >= ids.size:
            return  # numpy sorts the whole sample then: choose_victims never asks C
        ctx = ScoreContext(0, 1000.0, 100, len(records), 0, 0.0)
        columns = {name: v.entries[name][ids] for name in ("expires_at", *RANKED_FIELD_VALUES)}
        expected = rank_victims(POLICIES[policy], columns, ctx, top=top).tolist()
        fast = pool._engine.table.fast
        kind = fastpath.RANK_KINDS[policy]
        assert fast.rank(v.raw, kind, ids, top, 1000.0) == expected
        ids[-1] = v.geometry.max_entries  # out of range: numpy's, which raises
        assert fast.rank(v.raw, kind, ids, top, 1000.0) is None
