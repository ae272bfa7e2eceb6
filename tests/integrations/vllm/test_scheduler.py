"""The scheduler side alone, over a real pool and stand-ins for vLLM's requests: what it
asks the pool, and what it keeps per request (no engine: milliseconds)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest

import kvcache
from kvcache.integrations.vllm.names import Caches
from kvcache.integrations.vllm.scheduler import SchedulerSide
from kvcache.prefix import KVLayout, PrefixCache

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
CHUNK, BLOCK = 8, 4


def _request(request_id: str, prompt: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=request_id, prompt_token_ids=prompt, num_tokens=len(prompt),
        cache_salt=None, lora_request=None, mm_features=[], prompt_embeds=None,
    )  # fmt: skip


def test_a_prompts_keys_are_hashed_once_and_dropped_when_it_finishes(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool("4M")
    scheduler = SchedulerSide(Caches(pool, "m", LAYOUT, CHUNK), BLOCK)
    hashed: list[int] = []
    chunk_keys = PrefixCache.chunk_keys

    def counted(self: PrefixCache, token_ids: object) -> list[str]:
        keys = chunk_keys(self, token_ids)
        hashed.append(len(keys))
        return keys

    monkeypatch.setattr(PrefixCache, "chunk_keys", counted)
    request = _request("a", list(range(100, 133)))  # 4 chunks and a token
    scheduler.on_new_request(request)
    assert scheduler.num_new_matched_tokens(request, 0) == 0
    keys = scheduler._requests["a"].keys
    assert keys is not None and hashed == [4]
    pool.put(keys[0], b"chunk")  # present is all a lookup checks
    for _ in range(3):  # vLLM asks each step the request waits
        assert scheduler.num_new_matched_tokens(request, 0) == CHUNK
    assert scheduler.num_new_matched_tokens(request, BLOCK) == CHUNK - BLOCK
    assert hashed == [4]
    scheduler.request_finished(request)
    assert "a" not in scheduler._requests
