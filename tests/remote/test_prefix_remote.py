"""PrefixCache over a pool with a remote: another host's prefix found in one pipelined
round trip, retrieved in at most two more, exact, and promoted; a damaged chunk in Redis
cuts the prefix there, never returns wrong KV."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from kvcache import KVLayout, PrefixCache
from kvcache.remote import records

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16")
CHUNK = 16
TOKENS = np.arange(5000, 5000 + 8 * CHUNK + 3)  # 8 full chunks and 3 tokens over


def make_kv(tokens: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    shape = (LAYOUT.num_layers, 2, LAYOUT.num_kv_heads, tokens, LAYOUT.head_dim)
    return rng.standard_normal(shape).astype(np.float16)


KV = make_kv(len(TOKENS))


@pytest.fixture
def hosts(names, redis_server):
    """(host A's PrefixCache, writing through; host B's, empty), sharing one namespace."""
    a = kvcache.create(
        names(), "8M", page_size="4K", remote=redis_server.url, namespace="ns", write_through=True
    )
    b = kvcache.create(names(), "8M", page_size="4K", remote=redis_server.url, namespace="ns")
    yield (
        PrefixCache(a, "model", LAYOUT, chunk_tokens=CHUNK),
        PrefixCache(b, "model", LAYOUT, chunk_tokens=CHUNK),
    )
    a.close()
    b.close()


def test_another_hosts_prefix_costs_one_round_trip_to_find_and_one_to_fetch(hosts):
    pc_a, pc_b = hosts
    assert pc_a.store(TOKENS, KV) == 8 * CHUNK
    pc_a.pool.remote.flush()
    remote = pc_b.pool.remote_stats
    calls = remote().calls
    assert pc_b.lookup(TOKENS) == 8 * CHUNK
    assert remote().calls == calls + 1
    calls = remote().calls
    kv, n = pc_b.retrieve(TOKENS)
    assert n == 8 * CHUNK and remote().calls <= calls + 2
    np.testing.assert_array_equal(kv, KV[:, :, :, : 8 * CHUNK])
    assert remote().hits == 8 and pc_b.pool.stats().promotions == 8
    calls = remote().calls
    assert pc_b.lookup(TOKENS) == 8 * CHUNK and remote().calls == calls  # local now


def test_a_damaged_chunk_in_redis_cuts_the_prefix_there(hosts, redis_server):
    pc_a, pc_b = hosts
    pc_a.store(TOKENS, KV)
    pc_a.pool.remote.flush()
    client = redis_server.client()
    names = sorted(client.keys("kvcache:ns:*"))
    assert len(names) == 8
    # damage one chunk's record: which one is found by reading each back through a pool
    victim = names[0]
    record = bytearray(client.get(victim))
    record[-1] ^= 0xFF
    client.set(victim, bytes(record))
    kv, n = pc_b.retrieve(TOKENS)
    assert n % CHUNK == 0 and n < 8 * CHUNK
    np.testing.assert_array_equal(kv, KV[:, :, :, :n])
    pc_b.pool.remote.flush()
    # >= 1: a chunk read again before the queued delete reached Redis is found damaged again
    # (and again not served)
    assert client.exists(victim) == 0 and pc_b.pool.remote_stats().damaged >= 1


def test_store_on_a_host_that_finds_the_prefix_remotely_writes_only_the_rest(hosts):
    pc_a, pc_b = hosts
    half = 4 * CHUNK
    pc_a.store(TOKENS[:half], KV[:, :, :, :half])
    pc_a.pool.remote.flush()
    assert pc_b.store(TOKENS, KV) == 4 * CHUNK  # the first 4 chunks are the remote's
    assert pc_b.lookup(TOKENS) == 8 * CHUNK


def test_keys_in_redis_name_no_tokens(hosts, redis_server):
    pc_a, _ = hosts
    pc_a.store(TOKENS, KV)
    pc_a.pool.remote.flush()
    for name in redis_server.client().keys("*"):
        assert name.startswith(b"kvcache:ns:{") and records.parts_of(
            redis_server.client().get(name), 1 << 40
        )
