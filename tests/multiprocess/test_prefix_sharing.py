"""A prefix stored by one process is reused by another attached to the same pool."""

from __future__ import annotations

import numpy as np
import pytest
from prefix_workers import (
    CHUNK,
    HAMMER_CHUNK,
    LAYOUT,
    PREFIX_WORKERS,
    hammer_prompt,
    llama_prompt,
    run_child,
    seeded_kv,
    seeded_tokens,
)
from workers import Children

from kvcache import PrefixCache


def test_kv_stored_by_an_exited_process_is_retrieved_here_and_back(make_pool) -> None:
    pool = make_pool("16M")
    assert run_child("store-kv", pool=pool.name, seed=1, tokens=100)["stored"] == 96

    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    kv, n = pc.retrieve(seeded_tokens(1, 100))
    assert n == 96
    np.testing.assert_array_equal(kv, seeded_kv(1, 100)[:, :, :, :96])

    pc.store(seeded_tokens(2, 50), seeded_kv(2, 50))
    assert run_child("retrieve-kv", pool=pool.name, seed=2, tokens=50) == {"n": 48, "same": True}
    # a prompt sharing only a prefix with what was stored
    assert pc.lookup(np.r_[seeded_tokens(1, 100)[:40], [7] * 60]) == 32


def test_generate_in_a_second_process_reuses_the_first_ones_prefix(make_pool) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from prefix_workers import tiny_llama

    pool = make_pool("16M", page_size="4K")
    first = run_child("generate", pool=pool.name, seed=3, tokens=40, new_tokens=10)
    second = run_child("generate", pool=pool.name, seed=3, tokens=40, new_tokens=10)
    assert first["reused"] == 0
    assert second["reused"] == 40  # all 5 chunks of the prompt, made by the first process
    with torch.inference_mode():
        ids = llama_prompt(3, 40)
        expected = tiny_llama().generate(ids, max_new_tokens=10, do_sample=False)[0].tolist()
    assert first["tokens"] == second["tokens"] == expected
    assert pool.stats().hits >= 4  # counted in the shared pool


def test_concurrent_stores_and_retrieves_under_eviction_never_return_wrong_kv(make_pool) -> None:
    """Three processes store and retrieve 6 prompts in a pool that holds about a third
    of them, so chunks are evicted and their pages reused while others copy them out.
    Every hit must be exactly the KV stored for those tokens."""
    prompts = 6
    chunk_bytes = HAMMER_CHUNK * LAYOUT.token_bytes
    total_chunks = sum(len(hammer_prompt(seed)[0]) // HAMMER_CHUNK for seed in range(prompts))
    pool = make_pool(str(chunk_bytes * total_chunks // 3), page_size="16K")
    with Children(PREFIX_WORKERS) as children:
        hammers = [
            children.start("prefix-hammer", pool=pool.name, seed=seed, prompts=prompts, seconds=3.0)
            for seed in range(3)
        ]
        results = [children.result(hammer, timeout=120) for hammer in hammers]
    assert [r["failures"] for r in results] == [[], [], []]
    assert all(r["stores"] > 0 and r["retrieves"] > 0 for r in results)
    assert sum(r["hits"] for r in results) > 0
    assert sum(r["partial"] for r in results) > 0  # some prefixes were cut short by eviction
    stats = pool.stats()
    assert stats.evictions > 0
    assert pool.check() == []
