"""The ``prefix`` policy and the chunk tree it keeps: descendants go with their chunk
(eviction, delete, expiry, repair), a chunk whose parent is gone is not stored, new
chunks wait on probation whose target ghosts move; PrefixCache names each chunk's
parent. Its hit ratio against a plain model is in tests/test_exact_policies.py."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from kvcache import KVLayout, PrefixCache
from kvcache.layout import ENTRY_WORDS, E
from kvcache.queues import PROBATION

PAGE = 1024
SLOTS = 8


@pytest.fixture
def prefix_pool(make_pool, clock):
    def make(slots: int = SLOTS, **kwargs):
        return make_pool(size=slots * PAGE, page_size=PAGE, policy="prefix", clock=clock, **kwargs)

    return make


def put_prompt(pool, prompt: str, **kwargs) -> None:
    """Store the chunks of ``prompt`` ("a/b/c": chunks "a", "a/b", "a/b/c"), each under
    the one before it, as PrefixCache.store does."""
    parts = prompt.split("/")
    for end in range(1, len(parts) + 1):
        parent = "/".join(parts[: end - 1]) or None
        pool.put("/".join(parts[:end]), b"v" * 100, parent=parent, **kwargs)


def stranded(pool) -> list[str]:
    """Chunks whose parent chunk is not in the pool (keys name their whole prefix)."""
    keys = set(pool.keys())
    return [k for k in keys if "/" in k and k.rsplit("/", 1)[0] not in keys]


def test_an_unread_chunk_on_probation_goes_with_the_chunks_below_it(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "sys/a/b/c")
    put_prompt(pool, "x/y")
    put_prompt(pool, "z")
    pool.get("sys")  # read again, but sys/a (and below) were not: they go together
    pool.put("w", b"v")  # the eighth: room for it
    pool.put("q", b"v")  # sys, read, moves to main; sys/a is the oldest unread
    assert set(pool.keys()) == {"sys", "x", "x/y", "z", "w", "q"}
    assert pool.stats().evictions == 3
    assert stranded(pool) == []
    ghosts = pool._engine.table.queues.ghosts
    assert ghosts.count(PROBATION) == 3  # the chain is remembered whole


def test_chunks_read_on_probation_outlive_new_unread_ones(prefix_pool):
    pool = prefix_pool()
    for i in range(SLOTS):
        pool.put(f"k{i}", b"v")
    for i in range(SLOTS // 2):
        pool.get(f"k{i}")
    pool.put("new", b"v")
    assert f"k{SLOTS // 2}" not in pool  # the oldest unread
    assert all(f"k{i}" in pool for i in range(SLOTS // 2)) and "new" in pool


@pytest.mark.parametrize("unread_first", [True, False])
def test_an_unread_chunk_never_outlives_the_chunks_read_before_it(prefix_pool, unread_first):
    """Probation below its target gives way to main, unless its oldest chunk waited longer
    than main's least recently used was idle: then that unread chunk goes first."""
    pool = prefix_pool()
    unread, read = ["u0", "u1", "u2"], [f"r{i}" for i in range(SLOTS - 3)]
    for key in read if not unread_first else []:
        pool.put(key, b"v")
        pool.get(key)
    for key in unread:
        pool.put(key, b"v")
    for key in read if unread_first else []:
        pool.put(key, b"v")
        pool.get(key)
    pool._engine.table.queues.target = 5.0  # probation (3) is below its target
    pool.put("new", b"v")
    gone = {"u0", "r0", *unread, *read, "new"} - set(pool.keys())
    assert gone == ({"u0"} if unread_first else {"r0"})
    assert pool.check() == []


def test_a_chain_put_again_from_probations_ghosts_goes_to_main_and_grows_probation(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "a/b")
    for i in range(SLOTS - 1):
        pool.put(f"k{i}", b"v")  # a (and a/b with it) is evicted unread
    queues = pool._engine.table.queues
    assert "a" not in pool and queues.target == 0.0  # not moved yet: 10% of entries
    put_prompt(pool, "a/b")
    entries, find = pool._engine.views.entries, pool._engine.table.find
    records = {key: entries[find(key.encode())] for key in ("a", "a/b")}
    assert all(record["probation"] == 0 for record in records.values())  # in main
    assert queues.target > 0.1 * len(pool)
    assert pool.check() == []


def test_regression_a_returning_prompt_moved_probations_target_once_per_chunk(prefix_pool):
    """A prompt that comes back from the ghosts is one sign that probation was too small,
    however many chunks it has: counted per chunk, long prompts swung the target across
    the pool. Its first chunk moves the target, the chunks under it do not; the next
    prompt that comes back moves it again."""
    pool = prefix_pool(slots=40)
    put_prompt(pool, "a/b/c/d/e/f")
    put_prompt(pool, "z/y")
    for i in range(40):
        pool.put(f"k{i}", b"v")  # a goes with the five below it, then z with z/y
    queues = pool._engine.table.queues
    assert queues.ghosts.count(PROBATION) == 8 and queues.target == 0.0
    targets = []
    for prompt in ("a/b/c/d/e/f", "z/y"):
        parts = prompt.split("/")
        for end in range(1, len(parts) + 1):
            parent = "/".join(parts[: end - 1]) or None
            pool.put("/".join(parts[:end]), b"v", parent=parent)
            targets.append(queues.target)
    first = targets[0]
    assert first > 0.0 and targets[:6] == [first] * 6  # one prompt: one move
    assert targets[6] > first and targets[7] == targets[6]
    assert pool.check() == []


@pytest.mark.parametrize("num_children", [2, 3])
def test_a_shared_chunk_outlives_main_chunks_read_after_it(prefix_pool, num_children):
    """A chunk with three children put under it is shared by other prompts (a document
    many sessions quote): it and the chunks above it skip main's least recently used end
    once per child from the third on. Two children are one conversation going on past its
    partial last chunk: no credit, and the least recently used chunk goes with its tree."""
    pool = prefix_pool()
    put_prompt(pool, "sys/doc")
    children = [f"sys/doc/{i}" for i in range(num_children)]
    for key in children:
        pool.put(key, b"v", parent="sys/doc")
    others = [f"x{i}" for i in range(SLOTS - 2 - num_children)]
    for key in others:
        pool.put(key, b"v")
    for key in ["sys", "sys/doc", *children, *others]:  # all read: main, sys least recent
        assert pool.get(key) is not None
    pool.put("new", b"v")
    if num_children == 3:  # sys and sys/doc go round again; the first child leaves
        assert set(pool.keys()) == {"sys", "sys/doc", *children[1:], *others, "new"}
    else:  # sys goes, and the chunks below it with it
        assert set(pool.keys()) == {*others, "new"}
    assert pool.check() == []


def test_a_chunk_whose_other_children_left_earns_no_credit(prefix_pool):
    """Three children put under a chunk, but the first two gone when the third comes: one
    conversation's turns, not a chunk other prompts build on now. No credit: the least
    recently used chunk leaves with its tree, as with two children."""
    pool = prefix_pool()
    put_prompt(pool, "sys/doc")
    for i in range(2):
        pool.put(f"sys/doc/{i}", b"v", parent="sys/doc")
        del pool[f"sys/doc/{i}"]
    pool.put("sys/doc/2", b"v", parent="sys/doc")
    others = [f"x{i}" for i in range(SLOTS - 3)]
    for key in others:
        pool.put(key, b"v")
    for key in ["sys", "sys/doc", "sys/doc/2", *others]:  # all read: main, sys least recent
        assert pool.get(key) is not None
    pool.put("new", b"v")
    assert set(pool.keys()) == {*others, "new"}
    assert pool.check() == []


def test_a_shared_chunks_credits_run_out(prefix_pool):
    """Each pass of main a shared chunk skips costs a credit: unread, it leaves at the end of
    as many extra passes as it was credited (the third child gives one)."""
    pool = prefix_pool()
    put_prompt(pool, "doc")
    for i in range(3):
        pool.put(f"doc/{i}", b"v", parent="doc")
    for key in ["doc", "doc/0", "doc/1", "doc/2"]:
        assert pool.get(key) is not None
    for i in range(3 * SLOTS):  # each new key is read at once: main is the only queue
        pool.put(f"k{i}", b"v")
        pool.get(f"k{i}")
        if "doc" not in pool:
            break
    # k4 found the pool full: doc went round (its credit spent) and doc/0 left; then
    # doc/1, doc/2 and k0-k3 left before doc, read last before all of them
    assert i == 11
    assert pool.check() == []


def test_a_chunk_whose_parent_is_not_here_is_not_stored(prefix_pool):
    pool = prefix_pool()
    pool.put("a/b", b"v", parent="a")
    assert "a/b" not in pool and len(pool) == 0


def test_removing_a_chunk_removes_every_chunk_below_it(prefix_pool, clock):
    pool = prefix_pool()
    put_prompt(pool, "a/b/c")
    put_prompt(pool, "a/b/d")
    pool.put("a/e", b"v", parent="a", ttl=10)
    pool.put("a/e/f", b"v", parent="a/e")
    pool.delete("a/b")
    assert set(pool.keys()) == {"a", "a/e", "a/e/f"}
    clock.advance(11)
    assert pool.evict(expired=True).num_expired == 2  # a/e/f goes with it
    put_prompt(pool, "r/s/t")
    assert pool.clear() == 4  # a, r, r/s, r/s/t
    assert pool.check() == []


def test_a_chunk_put_again_keeps_its_children(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "a/b/c")
    pool.put("a/b", b"new", parent="a")
    assert pool["a/b"] == b"new" and "a/b/c" in pool
    pool.delete("a/b")
    assert set(pool.keys()) == {"a"}
    assert pool.check() == []


def test_a_chunk_cannot_become_its_own_descendant(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "a/b")
    pool.put("a", b"v", parent="a/b")  # declined: it would cut a cycle out of the tree
    assert set(pool.keys()) == {"a", "a/b"}
    assert pool.check() == []


def test_other_policies_ignore_parents(make_pool):
    pool = make_pool(size=SLOTS * PAGE, page_size=PAGE, policy="lru")
    pool.put("a/b", b"v", parent="a")
    assert "a/b" in pool


def test_no_chunk_is_stranded_in_a_churned_sampled_pool(prefix_pool):
    """More entries than eviction samples: victims are sampled, inner chunks among them."""
    pool = prefix_pool(slots=300, eviction_samples=8)
    rng = np.random.default_rng(5)
    prompts: list[str] = []
    for i in range(1500):
        if prompts and rng.random() < 0.6:
            base = prompts[rng.integers(len(prompts))].split("/")
            prompt = "/".join([*base[: rng.integers(1, len(base) + 1)], f"t{i}"])
        else:
            prompt = "/".join(f"s{i}-{j}" for j in range(rng.integers(1, 6)))
        prompts.append(prompt)
        put_prompt(pool, prompt)
        if i % 7 == 0:
            pool.delete(prompts[rng.integers(len(prompts))].rsplit("/", 1)[0])
        assert stranded(pool) == [], i
    assert pool.stats().evictions > 1000
    assert pool.check() == []


def test_repair_drops_chunks_whose_parent_is_gone(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "a/b/c")
    put_prompt(pool, "x")
    eid = pool.locate("a").eid
    q = pool._engine.views.entries_q
    # a crash mid-removal: "a" freed, its descendants still READY
    pool._engine.table.index.remove(eid, q[eid * ENTRY_WORDS + E.hash_lo])
    pool._engine.table.entries.remove_live(eid)
    pool._engine.table.free_entry(eid)
    problems = pool.check()
    assert any("the chunk before it in its prompt is gone" in p for p in problems)
    pool.check(repair=True)
    assert set(pool.keys()) == {"x"} and pool.check() == []


def test_repair_relinks_a_damaged_child_list(prefix_pool):
    pool = prefix_pool()
    put_prompt(pool, "a/b")
    put_prompt(pool, "a/c")
    pool._engine.views.entries_q[pool.locate("a").eid * ENTRY_WORDS + E.first_child] = 0
    assert any("list of children" in p for p in pool.check())
    pool.check(repair=True)
    assert pool.check() == []
    pool.delete("a")
    assert len(pool) == 0


def test_prefix_cache_chunks_go_with_the_first(make_pool):
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")
    cache = PrefixCache(make_pool(policy="prefix"), "m", layout, chunk_tokens=4)
    tokens = list(range(16))
    kv = np.ones((1, 2, 1, 16, 4), np.float32)
    assert cache.store(tokens, kv) == 16
    assert cache.lookup(tokens) == 16
    cache.pool.delete(cache.chunk_keys(tokens)[0])
    assert len(cache.pool) == 0


def test_the_prefix_policy_is_listed():
    assert "prefix" in kvcache.policies.POLICIES


def test_pools_made_for_prefix_caches_default_to_the_prefix_policy(pool_name):
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")
    cache = PrefixCache.create(pool_name, "1M", "m", layout, chunk_tokens=4, page_size="4K")
    try:
        assert cache.pool.config.policy == "prefix" and cache.chunk_tokens == 4
        with pytest.raises(kvcache.PoolExistsError):
            PrefixCache.create(pool_name, "1M", "m", layout)
    finally:
        cache.pool.close()


def test_prefix_cache_stores_every_chunk_under_the_prefix_policy(make_pool):
    pool = make_pool(size=SLOTS * PAGE, page_size=PAGE, policy="prefix")
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")
    cache = PrefixCache(pool, "m", layout, chunk_tokens=4)
    kv = np.ones((1, 2, 1, 16, 4), np.float32)
    assert cache.store(list(range(16)), kv) == 16
    assert cache.lookup(range(16)) == 16 and pool.check() == []


def test_regression_an_eviction_walked_the_chunks_below_its_victim_three_times(prefix_pool):
    """Under the lock, the policy (to ghost them), the regret sample and the removal each
    walked the victim's chunks; the policy's walk now serves all three."""
    pool = prefix_pool()
    put_prompt(pool, "sys/a/b/c")
    put_prompt(pool, "x/y/z/w")
    pool._engine._put = None  # Python's eviction (the compiled put walks them in C, once)
    tree = pool._engine.table.tree
    walks: list[int] = []
    walk = tree.descendants
    tree.descendants = lambda eid: walks.append(eid) or walk(eid)  # counts, then walks
    pool.put("q", b"v")  # the oldest unread chunk, "sys", goes with its three below
    assert set(pool.keys()) == {"x", "x/y", "x/y/z", "x/y/z/w", "q"}
    assert len(walks) == 1 and pool.check() == [] and stranded(pool) == []
    assert pool._engine.table.queues.ghosts.count(PROBATION) == 4
