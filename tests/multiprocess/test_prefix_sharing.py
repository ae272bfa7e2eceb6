"""A prefix stored by one process is reused by another attached to the same pool."""

from __future__ import annotations

import numpy as np
import pytest
from prefix_workers import CHUNK, LAYOUT, llama_prompt, run_child, seeded_kv, seeded_tokens

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
