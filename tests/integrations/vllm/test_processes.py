"""Real vLLM processes around one pool: killed mid-store, on a disk pool, refused at start,
and behind the OpenAI server."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import engines
import pytest
from models import prompt

import kvcache
from kvcache.integrations.vllm.testmodel import build_model
from kvcache.prefix import KVLayout, PrefixCache

P = prompt(1025, seed=1)
EAGER = {"enforce_eager": True}
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="bfloat16")


def _config(model: str, pool: str, **more: Any) -> dict[str, Any]:
    return {"model": model, "engine": EAGER, "rounds": [[P]], "connector": {"pool": pool}, **more}


def test_sigkill_mid_store_leaves_a_pool_the_next_engine_repairs_and_uses(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path
) -> None:
    pool = names()
    kvcache.create(pool, "256M", policy="prefix").close()
    env = engines.engine_env(private_home)
    crashing = _config(model, pool, module="connectors", **{"class": "CrashingConnector"})
    status, output = engines.finish(engines.start(crashing, tmp_path, env))
    assert status == -signal.SIGKILL, output[-3000:]
    with kvcache.open(pool) as handle:  # opening reclaims the dead writer's entry
        assert handle.check() == []
        assert PrefixCache(handle, model, LAYOUT).lookup(P) == 512  # 2 chunks before the kill
    after = engines.run(_config(model, pool), tmp_path, env)[0][0]
    assert after["num_cached_tokens"] == 512
    with kvcache.open(pool) as handle:
        assert handle.check() == []
        assert PrefixCache(handle, model, LAYOUT).lookup(P) == 1024  # the rest stored again


def test_chunks_gone_before_their_load_are_recomputed(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path
) -> None:
    """The third of P's four chunks leaves the pool between the lookup and the load: the
    load reports its blocks and those after it, and vLLM recomputes them, answering as an
    engine that found only the first two chunks does (the same numeric path: exact)."""
    pool = names()
    env = engines.engine_env(private_home)
    engines.run(_config(model, pool, connector={"pool": pool, "size": "256M"}), tmp_path, env)
    vanishing = _config(model, pool, module="connectors", **{"class": "VanishingConnector"})
    recomputed = engines.run(vanishing, tmp_path, env)[0][0]
    with kvcache.open(pool) as handle:
        assert PrefixCache(handle, model, LAYOUT).lookup(P) == 512
    found_two = engines.run(_config(model, pool), tmp_path, env)[0][0]
    assert found_two["num_cached_tokens"] == 512
    assert recomputed["tokens"] == found_two["tokens"]
    assert recomputed["logprobs"] == found_two["logprobs"]


def test_a_disk_pool_serves_the_next_engine(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path
) -> None:
    pool = names()
    env = engines.engine_env(private_home)
    config = _config(model, pool, connector={"pool": pool, "size": "256M", "tier": "disk"})
    first = engines.run(config, tmp_path, env)[0][0]
    second = engines.run(config, tmp_path, env)[0][0]
    assert (first["num_cached_tokens"], second["num_cached_tokens"]) == (0, 1024)
    with kvcache.open(pool) as handle:
        assert handle.tier == "disk" and handle.check() == []


def test_a_preempted_request_resumes_from_the_pool(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path
) -> None:
    """20 blocks of 128 tokens hold two 1200-token prompts (10 blocks each) but not their
    81st new tokens: vLLM preempts one, frees its blocks, and recomputes it later, when the
    connector loads its prompt's chunks again (the pool's third hit). With room, nothing
    is preempted; both runs load the prompts from the pool."""
    pool = names()
    env = engines.engine_env(private_home)
    prompts = [prompt(1200, seed=5), prompt(1200, seed=6)]
    config = _config(model, pool, rounds=[prompts], max_tokens=120,
                     connector={"pool": pool, "size": "256M"})  # fmt: skip
    engines.run(config, tmp_path, env)  # fills the pool

    def hits_of(engine: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        with kvcache.open(pool) as handle:
            before = handle.metrics().tokens[model].hit
        outputs = engines.run({**config, "engine": engine}, tmp_path, env)[0]
        with kvcache.open(pool) as handle:
            return handle.metrics().tokens[model].hit - before, outputs

    roomy_hits, roomy = hits_of(EAGER)
    # 21 blocks: vLLM keeps one back (its null block); max_model_len: what 20 blocks hold
    squeeze = {"num_gpu_blocks_override": 21, "max_model_len": 2048}
    squeezed_hits, squeezed = hits_of({**EAGER, **squeeze})
    assert (roomy_hits, squeezed_hits) == (2 * 1024, 3 * 1024)
    # Up to the preemption (block 11 starts at token 1280: 80 new tokens) both runs did the
    # same; after it vLLM recomputes the generated tokens' KV in one prefill, which rounds
    # differently from their decoding in bfloat16 (near-tied logits of random weights: it
    # changed token 119 of 120 here), so the rest is compared only for its length.
    for wide, tight in zip(roomy, squeezed, strict=True):
        assert tight["tokens"][:80] == wide["tokens"][:80]
        assert len(tight["tokens"]) == len(wide["tokens"]) == 120


@pytest.mark.parametrize(
    ("sliding_window", "chunk_tokens", "message"),
    [
        (64, 256, "plain full attention"),
        (0, 100, r"chunk_tokens \(100\) must be a multiple of vLLM's block size \(128\)"),
    ],
)
def test_what_the_connector_cannot_store_stops_the_engine_at_start(
    sliding_window: int,
    chunk_tokens: int,
    message: str,
    model: str,
    names: Callable[[], str],
    tmp_path: Path,
    private_home: Path,
) -> None:
    if sliding_window:
        model = str(build_model(tmp_path / "mistral", sliding_window=sliding_window))
    pool = names()
    connector = {"pool": pool, "size": "64M", "chunk_tokens": chunk_tokens}
    env = engines.engine_env(private_home)
    status, output = engines.finish(
        engines.start(_config(model, pool, connector=connector), tmp_path, env)
    )
    assert status != 0
    assert re.search(message, output), output[-3000:]


@pytest.fixture
def server_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def api_server(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path, server_port: int
) -> Iterator[tuple[str, str]]:
    """vLLM's OpenAI server with the connector, in vLLM's default multi-process mode."""
    pool = names()
    engines.run(
        _config(model, pool, connector={"pool": pool, "size": "256M"}),
        tmp_path, engines.engine_env(private_home),
    )  # fmt: skip
    transfer = {
        "kv_connector": "KVCacheConnector",
        "kv_connector_module_path": "kvcache.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"pool": pool},
    }
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--port", str(server_port), "--host", "127.0.0.1", "--dtype", "bfloat16",
         "--max-model-len", "4096", "--gpu-memory-utilization", "0.05", "--enforce-eager",
         "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(transfer)],
        stdout=log, stderr=subprocess.STDOUT,
        env=engines.engine_env(private_home, multiprocess=True),
    )  # fmt: skip
    url = f"http://127.0.0.1:{server_port}"
    try:
        deadline = time.monotonic() + engines.TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(1)
        assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
        yield url, pool
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_the_openai_server_reports_tokens_from_the_pool_as_cached(
    api_server: tuple[str, str], model: str
) -> None:
    url, _ = api_server
    body = {"model": model, "prompt": P, "max_tokens": 4, "temperature": 0.0}
    answer = _post(f"{url}/v1/completions", body)
    assert answer["usage"]["prompt_tokens"] == 1025
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    hits = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:external_prefix_cache_hits_total")
    ]
    assert hits == [1024.0]
