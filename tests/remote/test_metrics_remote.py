"""The exporter reports a pool's remote tier from the pool's header, never dialling it."""

from __future__ import annotations

import time

import pytest
from servers import Server

import kvcache

metrics = pytest.importorskip("kvcache.metrics")


def test_remote_counters_come_without_dialling_the_remote(
    redis_server: Server, pool_name: str
) -> None:
    with kvcache.create(
        pool_name, "1M", page_size="4K", remote=redis_server.url, namespace="m", write_through=True
    ) as pool:
        pool.put("k", b"v" * 100)
        pool.get("absent")
    redis_server.stop()  # frozen: a connection attempt would wait for its timeout
    try:
        start = time.monotonic()
        text = metrics.exposition(pools=[pool_name])
        assert time.monotonic() - start < 2
    finally:
        redis_server.resume()
    remote = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if f'pool="{pool_name}"' in line and 'tier="remote"' in line
    }
    assert remote["kvcache_puts_total"] == 1  # written through
    assert remote["kvcache_misses_total"] == 1
    assert remote["kvcache_written_bytes_total"] > 100
    assert remote["kvcache_remote_calls_total"] >= 2
