"""The llama-server proxy on two "hosts": each its own pool and server, both pools chained
to one redis-server (or valkey-server). Host B's server finds the prompt host A's computed,
through Redis, and answers as A did."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="gguf is not installed: pip install 'kvcache[llama-cpp]'")
# the proxy's process helpers live beside its other tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))

from llama_servers import Proxy, complete, server_args
from servers import Server

import kvcache
from kvcache.integrations.gguf_model import ModelShape, write_model

PROMPT = " ".join(["the system prompt says the assistant answers each question"] * 40)


def test_host_b_finds_host_a_prompt_through_redis(
    names: Callable[[], str], redis_server: Server, tmp_path: Path
) -> None:
    model = write_model(tmp_path / "tiny.gguf", ModelShape())
    a = kvcache.create(names(), "64M", remote=redis_server.url, namespace="ns", write_through=True)
    b = kvcache.create(names(), "64M", remote=redis_server.url, namespace="ns")
    args = server_args(model)
    try:
        host_a = Proxy(a.name, args, tmp_path / "a.log", "--chunk-tokens", "64")
        try:
            cold = complete(host_a.url, PROMPT + " question one")
            host_a.wait_saved(1)
        finally:
            host_a.stop()
        host_b = Proxy(b.name, args, tmp_path / "b.log", "--chunk-tokens", "64")
        try:
            warm = complete(host_b.url, PROMPT + " question one")
            stats = host_b.wait_saved(1)
        finally:
            host_b.stop()
        promoted = b.stats().promotions
    finally:
        a.close()
        b.close()
    assert cold["timings"]["cache_n"] == 0
    assert warm["tokens"] == cold["tokens"] and warm["timings"]["prompt_n"] == 1
    assert stats["counts"]["restored"] == 1 and stats["problems"] == {}
    assert promoted >= 2  # the record and its markers came up from Redis
