"""The remote tier on a real 3-master Redis Cluster: keys spread over the shards, a
value's parts on one shard, pipelined lookups across slots, and a killed node."""

from __future__ import annotations

import os
import time

import kvcache
from kvcache.keys import encode_key
from kvcache.remote import records

NS = "cluster"


def head_name(key: str) -> str:
    return records.key_name(NS, encode_key(key)[0])


def test_entries_spread_over_the_shards_and_another_pool_reads_them_all(names, redis_cluster):
    with (
        kvcache.create(
            names(), "8M", remote=redis_cluster.url, namespace=NS, write_through=True
        ) as a,
        kvcache.create(names(), "8M", remote=redis_cluster.url, namespace=NS) as b,
    ):
        values = {f"k{i}": os.urandom(1000 + i) for i in range(60)}
        for key, value in values.items():
            a.put(key, value)
        assert a.remote.flush()
        per_node = [node.client().dbsize() for node in redis_cluster.nodes]
        assert sum(per_node) == 60 and all(n > 0 for n in per_node)
        keys = list(values)
        calls = b.remote_stats().calls
        assert b.count_present(keys) == 60 and b.prefetch(keys) == 60
        assert b.remote_stats().calls == calls + 2  # one pipelined call each, across slots
        assert all(b.get(key) == value and b.in_local_tiers(key) for key, value in values.items())


def test_a_split_value_lies_on_one_shard(names, redis_cluster):
    with (
        kvcache.create(
            names(), "8M", remote=redis_cluster.url, namespace=NS, write_through=True
        ) as a,
        kvcache.create(names(), "8M", remote=redis_cluster.url, namespace=NS) as b,
    ):
        a.remote.part_bytes = 32 * 1024
        value = os.urandom(200_000)
        a.put("big", value)
        a.remote.flush()
        client = redis_cluster.client()
        head = head_name("big")
        parts = [head, *records.part_names(head, records.parts_of(client.get(head), 1 << 40))]
        assert len(parts) >= 7
        assert len({client.keyslot(name) for name in parts}) == 1
        assert b.get("big") == value


def test_a_killed_node_is_a_miss_and_the_local_tiers_go_on(names, fresh_redis_cluster, monkeypatch):
    monkeypatch.setattr("kvcache.remote.link.FIRST_BACKOFF_S", 0.05)
    url = fresh_redis_cluster.url
    with (
        kvcache.create(
            names(), "8M", remote=url, namespace=NS, write_through=True, remote_timeout="200ms"
        ) as a,
        kvcache.create(names(), "8M", remote=url, namespace=NS, remote_timeout="200ms") as b,
    ):
        values = {f"k{i}": os.urandom(500) for i in range(30)}
        for key, value in values.items():
            a.put(key, value)
        a.remote.flush()
        b.put("local", b"kept")
        fresh_redis_cluster.nodes[1].kill()
        started = time.monotonic()
        found = {key: b.get(key) for key in values}
        assert time.monotonic() - started < 30  # a hang guard, not a timing assertion
        assert all(got is None or got == values[key] for key, got in found.items())
        assert b.get("local") == b"kept" and a.get("k0") == values["k0"]
        assert b.remote_stats().errors >= 1


def test_a_cluster_that_is_gone_is_a_miss_even_for_a_pool_opened_after(
    names, fresh_redis_cluster, monkeypatch
):
    """A Cluster client asks a node for the slot map as it is made: with every node gone,
    making it fails (RedisClusterException, not a RedisError), which was raised to the
    caller's get."""
    name = names()
    url = fresh_redis_cluster.url
    kvcache.create(name, "4M", remote=url, namespace=NS, remote_timeout="200ms").close()
    for node in fresh_redis_cluster.nodes:
        node.kill()
    with kvcache.open(name) as pool:
        pool.put("local", b"v")
        assert pool.get("missing") is None and pool.get("local") == b"v"
        assert not pool.remote_stats().up and pool.remote_stats().errors >= 1
    other = names()
    try:
        kvcache.create(other, "4M", remote=url, namespace=NS, remote_timeout="200ms")
    except kvcache.RemoteError as exc:
        assert "cannot reach remote" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("create succeeded against a Cluster that is gone")
    assert other not in kvcache.list_pools()
