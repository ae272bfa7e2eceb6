"""Two "hosts" sharing prompt prefixes through a real Redis: each has a pool of its own (as
two machines would), both naming the same remote and namespace, as ``demo --two-hosts``
does for transformers."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import engines
import pytest
from models import prompt

import kvcache

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "remote"))
from servers import Server  # real redis-server processes, as the remote tests use

P = prompt(1025, seed=1)
EAGER = {"enforce_eager": True}


@pytest.fixture
def redis_url() -> Iterator[str]:
    with closing(Server()) as server:
        yield server.url


def _host(names: Callable[[], str], url: str, namespace: str) -> str:
    """A host's pool: its own RAM pool whose last tier is the shared remote."""
    pool = names()
    kvcache.create(
        pool, "256M", policy="prefix", remote=url, namespace=namespace, write_through=True
    ).close()
    return pool


def _run(model: str, pool: str, tmp_path: Path, env: dict[str, str]) -> dict:
    config = {"model": model, "engine": EAGER, "rounds": [[P]], "connector": {"pool": pool}}
    return engines.run(config, tmp_path, env)[0][0]


def test_a_prompt_computed_on_one_host_is_loaded_on_another_through_redis(
    model: str, names: Callable[[], str], tmp_path: Path, private_home: Path, redis_url: str
) -> None:
    env = engines.engine_env(private_home)
    host_a, host_b = _host(names, redis_url, "team"), _host(names, redis_url, "team")
    elsewhere = _host(names, redis_url, "other-team")  # the control: another namespace
    computed = _run(model, host_a, tmp_path, env)
    from_redis = _run(model, host_b, tmp_path, env)
    not_shared = _run(model, elsewhere, tmp_path, env)
    assert computed["num_cached_tokens"] == 0
    assert from_redis["num_cached_tokens"] == 1024  # every whole block below the last token
    assert not_shared["num_cached_tokens"] == 0
    with kvcache.open(host_b) as pool:  # what host B loaded was promoted into its own pool
        assert pool.remote_stats().hits > 0
        assert len(pool) > 0 and pool.check() == []
    # the same numeric path on host A (its own pool now): host B's answer is exactly it
    local = _run(model, host_a, tmp_path, env)
    assert local["num_cached_tokens"] == 1024
    assert from_redis["tokens"] == local["tokens"]
    assert from_redis["logprobs"] == local["logprobs"]
