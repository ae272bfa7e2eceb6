"""The worker side alone, over a real pool and CPU tensors laid out as vLLM's CPU backend
lays out its blocks: stores in the background, settled before vLLM writes blocks again."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch

import kvcache
from kvcache.integrations.vllm.names import Caches, EngineKV
from kvcache.integrations.vllm.paged import PagedLayout
from kvcache.integrations.vllm.plan import StepPlan, Transfer
from kvcache.integrations.vllm.worker import WorkerSide
from kvcache.prefix import KVLayout, PrefixCache

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="bfloat16")
CHUNK, BLOCK, BLOCKS = 8, 4, 10
PROMPT = list(range(100, 116))  # two chunks, four blocks


def _worker(pool: kvcache.Pool) -> tuple[WorkerSide, dict[str, torch.Tensor]]:
    names = ("layer.0", "layer.1")
    worker = WorkerSide(
        Caches(pool, "m", LAYOUT, CHUNK), EngineKV(names, LAYOUT, BLOCK), PagedLayout.ROWS
    )
    generator = torch.Generator().manual_seed(0)
    caches = {
        name: torch.randn(BLOCKS, 2, BLOCK, 16, generator=generator).bfloat16() for name in names
    }
    worker.register(caches)
    return worker, caches


def test_a_store_runs_in_the_background_until_settled(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool("4M")
    worker, caches = _worker(pool)
    release = threading.Event()
    store = PrefixCache.store

    def held(self: PrefixCache, *args: object, **kwargs: object) -> int:
        release.wait(10)
        return store(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PrefixCache, "store", held)
    worker.save(StepPlan(stores=[Transfer("r", None, PROMPT, 0, [3, 5, 1, 7])]))
    pc = PrefixCache(pool, "m", LAYOUT, chunk_tokens=CHUNK)
    assert pc.lookup(PROMPT) == 0  # wait_for_save returned; the store waits
    release.set()
    worker.settle()
    assert pc.lookup(PROMPT) == 16
    kv, _ = pc.retrieve(PROMPT)
    rows = caches["layer.1"][5].view(2, 2, BLOCK, 8)  # block 5: tokens 4-7; (heads, K|V rows)
    values = rows[:, 1].contiguous().view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(kv[1, 1, :, 4:8], values)  # layer 1's values of those tokens
    worker.shutdown()


def test_what_a_background_store_raised_is_raised_when_settled(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, _ = _worker(make_pool("4M"))

    def failing(self: PrefixCache, *args: object, **kwargs: object) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(PrefixCache, "store", failing)
    worker.save(StepPlan(stores=[Transfer("r", None, PROMPT, 0, [0, 1, 2, 3])]))
    with pytest.raises(OSError, match="disk full"):
        worker.settle()
    worker.shutdown()
