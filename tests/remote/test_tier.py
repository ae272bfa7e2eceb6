"""The remote tier as a caller sees it, against a real redis-server: what reaches Redis,
what another pool (another host) finds there and promotes, demotion of evicted entries,
TTLs, deletes, split values, damage, URLs and passwords."""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

import kvcache
from kvcache.errors import InvalidArgument, RemoteError
from kvcache.keys import encode_key
from kvcache.remote import PASSWORD_ENV, records

NS = "team-a"


def redis_name(key: str, namespace: str = NS) -> str:
    return records.key_name(namespace, encode_key(key)[0])


@pytest.fixture
def two_pools(names, redis_server):
    """``make(**options)``: a pool on ``redis_server`` in namespace NS (each call a new one)."""
    made: list[kvcache.Pool] = []

    def make(size: str = "4M", **options: object) -> kvcache.Pool:
        options.setdefault("namespace", NS)
        made.append(kvcache.create(names(), size, remote=redis_server.url, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for pool in made:
        pool.close()


def test_a_write_through_put_reaches_redis_and_another_pool_promotes_it(two_pools, redis_server):
    host_a, host_b = two_pools(write_through=True), two_pools()
    value = os.urandom(100_000)
    host_a.put("doc", value)
    assert host_a.remote.flush()
    assert redis_server.client().exists(redis_name("doc")) == 1
    assert not host_b.in_local_tiers("doc") and "doc" in host_b
    assert host_b.get("doc") == value
    assert host_b.in_local_tiers("doc")  # promoted: the next get is local
    assert host_b.stats().promotions == 1
    stats = host_b.remote_stats()
    assert (stats.hits, stats.up, stats.bytes_in > len(value)) == (1, True, True)
    assert host_a.remote_stats().writes == 1 and host_a.remote_stats().bytes_out > len(value)


def test_arrays_and_their_dtype_come_back_from_the_remote(two_pools):
    host_a, host_b = two_pools(write_through=True), two_pools()
    array = np.arange(4096, dtype=np.float16).reshape(64, 64)
    host_a.put("kv", array)
    host_a.remote.flush()
    back = host_b.get("kv")
    assert back.dtype == np.float16 and back.shape == (64, 64) and np.array_equal(back, array)
    buffer = np.empty_like(array)
    other = two_pools()
    assert other.get_into("kv", buffer) is not None and np.array_equal(buffer, array)


def test_without_write_through_a_put_removes_the_remotes_older_value(two_pools, redis_server):
    writer, plain = two_pools(write_through=True), two_pools()
    writer.put("k", b"old")
    writer.remote.flush()
    plain.put("k", b"new")  # the remote's "old" must never come back to anyone
    plain.remote.flush()
    assert redis_server.client().exists(redis_name("k")) == 0
    assert two_pools().get("k") is None


def test_what_the_bottom_pool_evicts_is_demoted_and_found_again(two_pools, redis_server):
    pool = two_pools(size="1M", page_size="64K")  # 16 pages
    values = {f"k{i}": os.urandom(60_000) for i in range(40)}
    for key, value in values.items():
        pool.put(key, value)
    assert pool.remote.flush()
    evicted = [key for key in values if not pool.in_local_tiers(key)]
    assert evicted and pool.stats().spills >= len(evicted)
    assert all(redis_server.client().exists(redis_name(key)) for key in evicted)
    assert pool.get(evicted[0]) == values[evicted[0]]  # back from the remote, verified


def test_a_chain_demotes_from_its_bottom_pool(names, redis_server):
    disk_name, top_name = names(), names()
    disk = kvcache.create(disk_name, "1M", page_size="64K", tier="disk")
    top = kvcache.create(
        top_name, "1M", page_size="64K", spill_to=disk_name, remote=redis_server.url, namespace=NS
    )
    try:
        values = {f"k{i}": os.urandom(60_000) for i in range(60)}
        for key, value in values.items():
            top.put(key, value)
        top.remote.flush()
        in_redis = [key for key in values if redis_server.client().exists(redis_name(key))]
        assert in_redis and disk.stats().spills >= len(in_redis)
        # neither local tier holds what went to the remote, and a get still finds it
        gone = [key for key in in_redis if not top.in_local_tiers(key)]
        assert gone and top.get(gone[0]) == values[gone[0]]
    finally:
        top.close()
        disk.close()


def test_a_ttl_becomes_an_expiry_in_redis(two_pools, redis_server):
    pool = two_pools(write_through=True)
    pool.put("short", b"x", ttl=60)
    pool.put("forever", b"y")
    pool.remote.flush()
    client = redis_server.client()
    assert 50_000 < client.pttl(redis_name("short")) <= 60_000
    assert client.pttl(redis_name("forever")) == -1


def test_delete_removes_the_remote_copy_too(two_pools, redis_server):
    pool = two_pools(write_through=True)
    pool.put("k", b"v")
    pool.remote.flush()
    pool.delete("k")
    pool.remote.flush()
    assert redis_server.client().exists(redis_name("k")) == 0
    assert two_pools().get("k") is None


def test_namespaces_do_not_see_each_other(two_pools):
    writer = two_pools(write_through=True)
    writer.put("k", b"v")
    writer.remote.flush()
    assert two_pools(namespace="team-b").get("k") is None
    assert two_pools().get("k") == b"v"


def test_a_value_split_in_parts_comes_back_whole_and_one_lost_part_is_a_miss(
    two_pools, redis_server
):
    writer = two_pools(size="8M", write_through=True)
    writer.remote.part_bytes = 64 * 1024  # Redis's own limit is 512 MiB: a smaller one here
    value = os.urandom(300_000)
    writer.put("big", value)
    writer.remote.flush()
    client = redis_server.client()
    head = redis_name("big")
    parts = records.part_names(head, records.parts_of(client.get(head), 1 << 40))
    assert len(parts) >= 4 and all(client.exists(p) for p in parts)  # the parts after the head
    assert two_pools(size="8M").get("big") == value
    writer.put("big2", value)
    writer.remote.flush()
    head2 = redis_name("big2")
    client.delete(records.part_names(head2, records.parts_of(client.get(head2), 1 << 40))[1])
    reader = two_pools(size="8M")
    assert reader.get("big2") is None
    reader.remote.flush()
    assert client.exists(head2) == 0 and reader.remote_stats().damaged == 1


def test_a_value_corrupted_in_redis_is_a_miss_and_is_deleted(two_pools, redis_server):
    writer = two_pools(write_through=True)
    writer.put("k", os.urandom(10_000))
    writer.remote.flush()
    client = redis_server.client()
    client.setrange(redis_name("k"), 5000, b"\x00garbage\x00")
    reader = two_pools()
    assert reader.get("k") is None and not reader.in_local_tiers("k")
    reader.remote.flush()
    assert client.exists(redis_name("k")) == 0 and reader.remote_stats().damaged == 1


def test_a_value_written_under_another_key_is_never_served(two_pools, redis_server):
    writer = two_pools(write_through=True)
    writer.put("a", b"value of a")
    writer.remote.flush()
    client = redis_server.client()
    client.set(redis_name("b"), client.get(redis_name("a")))  # a record copied to b's name
    assert two_pools().get("b") is None


def test_a_unix_socket_url(names, redis_unix):
    with kvcache.create(
        names(), "4M", remote=redis_unix.url, namespace=NS, write_through=True
    ) as a:
        a.put("k", b"v")
        a.remote.flush()
        with kvcache.create(names(), "4M", remote=redis_unix.url, namespace=NS) as b:
            assert b.get("k") == b"v"


def test_a_valkey_url_is_the_same_protocol(names, redis_server):
    url = redis_server.url.replace("redis://", "valkey://", 1)
    with kvcache.create(names(), "4M", remote=url, namespace=NS, write_through=True) as a:
        a.put("k", b"v")
        assert a.remote.flush() and a.remote_stats().writes == 1
    with kvcache.create(names(), "4M", remote=redis_server.url, namespace=NS) as b:
        assert b.get("k") == b"v"


def test_a_tls_server_trusted_through_the_ca_named_in_the_url(names, redis_tls):
    with kvcache.create(names(), "4M", remote=redis_tls.url, namespace=NS, write_through=True) as a:
        a.put("k", b"over TLS")
        assert a.remote.flush() and a.remote_stats().writes == 1
        with kvcache.create(names(), "4M", remote=redis_tls.url, namespace=NS) as b:
            assert b.get("k") == b"over TLS"
    # what went over the wire was TLS: the server takes no plain connection on its port
    plain = redis_tls.url.replace("rediss://", "redis://").partition("?")[0]
    with pytest.raises(RemoteError, match="cannot reach remote"):
        kvcache.create(names(), "4M", remote=plain, namespace=NS)


def test_a_tls_server_with_an_untrusted_certificate_is_a_one_line_error_at_create(names, redis_tls):
    name = names()
    untrusted = redis_tls.url.partition("?")[0]  # the system's authorities know no such CA
    with pytest.raises(RemoteError) as caught:
        kvcache.create(name, "4M", remote=untrusted, namespace=NS)
    assert "cannot reach remote" in str(caught.value) and "\n" not in str(caught.value)
    assert name not in kvcache.list_pools()


def test_a_password_from_the_environment(names, redis_password, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, redis_password.password)
    with kvcache.create(names(), "4M", remote=redis_password.url, namespace=NS) as pool:
        assert pool.remote.ping() is not None and pool.remote_stats().up


def test_a_password_from_a_file_is_read_by_every_opener(names, redis_password, tmp_path):
    secret = tmp_path / "redis.pass"
    secret.write_text(redis_password.password + "\n")
    secret.chmod(0o600)
    name = names()
    kvcache.create(
        name,
        "4M",
        remote=redis_password.url,
        namespace=NS,
        password_file=secret,
        write_through=True,
    ).close()
    with kvcache.open(name) as pool:
        pool.put("k", b"v")
        assert pool.remote.flush() and pool.remote_stats().writes == 1


@pytest.mark.parametrize("password", [None, "wrong"])
def test_a_refused_password_at_create_is_one_line_and_makes_no_pool(
    names, redis_password, monkeypatch, password
):
    if password:
        monkeypatch.setenv(PASSWORD_ENV, password)
    else:
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
    name = names()
    with pytest.raises(RemoteError) as caught:
        kvcache.create(name, "4M", remote=redis_password.url, namespace=NS)
    assert "\n" not in str(caught.value) and PASSWORD_ENV in str(caught.value)
    assert name not in kvcache.list_pools()


def test_an_unreachable_remote_at_create_is_one_line_and_makes_no_pool(names, redis_server):
    url = redis_server.url
    redis_server.kill()
    name = names()
    with pytest.raises(RemoteError, match="cannot reach remote"):
        kvcache.create(name, "4M", remote=url, namespace=NS)
    assert name not in kvcache.list_pools()


@pytest.mark.parametrize(
    ("url", "namespace", "says"),
    [
        ("http://127.0.0.1:6379", NS, "is not one of redis://"),
        ("redis://:secret@127.0.0.1:6379", NS, "holds a password"),
        ("redis://user:secret@127.0.0.1:6379", NS, "holds a password"),
        ("redis://127.0.0.1:6379", None, "needs --namespace"),
        ("redis://127.0.0.1:6379", "bad namespace!", "namespace"),
        ("redis://127.0.0.1:6379", "", "namespace"),
        ("redis://127.0.0.1:99999", NS, "is not HOST:PORT"),
        ("unix://relative/path", NS, "absolute socket path"),
        ("redis://[::1", NS, "does not parse"),
        ("redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", NS, "option 'ssl_ca_certs'"),
        ("rediss://127.0.0.1:6379/0?ssl_ca_certs=", NS, "option 'ssl_ca_certs'"),
        ("rediss://127.0.0.1:6379/0?timeout=3", NS, "option 'timeout'"),
        ("redis+cluster://127.0.0.1:7000?db=1", NS, "option 'db'"),
        ("", NS, "remote URL"),
    ],
)
def test_bad_remote_arguments_are_refused_before_anything_is_made(names, url, namespace, says):
    name = names()
    with pytest.raises(InvalidArgument) as caught:
        kvcache.create(name, "4M", remote=url, namespace=namespace)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert name not in kvcache.list_pools()


def test_remote_options_without_a_remote_are_refused(names):
    with pytest.raises(InvalidArgument, match="need --remote"):
        kvcache.create(names(), "4M", namespace=NS)


def test_the_remote_is_kept_in_the_pool_for_every_process_that_opens_it(names, redis_server):
    name = names()
    kvcache.create(name, "4M", remote=redis_server.url, namespace=NS, write_through=True).close()
    with kvcache.open(name) as pool:
        stats = pool.remote_stats()
        assert (stats.url, stats.namespace, stats.write_through) == (redis_server.url, NS, True)
        assert math.isclose(pool.remote.spec.timeout_s, 0.25)


def test_a_pool_without_a_remote_has_none(make_pool):
    pool = make_pool()
    assert pool.remote is None and pool.remote_stats() is None
    assert pool.count_present(["a", "b"]) == 0 and pool.prefetch(["a"]) == 0


def test_count_present_asks_the_remote_in_one_call(two_pools):
    writer = two_pools(write_through=True)
    for i in range(5):
        writer.put(f"c{i}", b"v")
    writer.remote.flush()
    reader = two_pools()
    reader.put("c0", b"v")  # local (and its writer removes the remote's c0: a call)
    reader.remote.flush()
    calls = reader.remote_stats().calls
    assert reader.count_present([f"c{i}" for i in range(8)]) == 5
    assert reader.remote_stats().calls == calls + 1
    calls = reader.remote_stats().calls
    assert reader.prefetch([f"c{i}" for i in range(8)]) == 4  # c1..c4 came; stops at c5
    assert reader.remote_stats().calls == calls + 1
    assert all(reader.in_local_tiers(f"c{i}") for i in range(5))


def test_one_warning_per_outage(two_pools, redis_server, caplog, monkeypatch):
    monkeypatch.setattr("kvcache.remote.link.FIRST_BACKOFF_S", 0.0)
    pool = two_pools()
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="kvcache.remote.link"):
        for _ in range(5):
            assert pool.get("missing") is None
    downs = [r for r in caplog.records if "is down" in r.getMessage()]
    assert len(downs) == 1 and pool.remote_stats().errors >= 1


def test_bug_flush_returned_while_the_writer_still_held_a_delete(two_pools, redis_server):
    """flush waited for queued bytes, and a delete has none: it said "all sent" as soon as
    the writer took the batch, before the delete reached Redis."""
    pool = two_pools(write_through=True, remote_timeout="2s")
    pool.put("k", b"v")
    assert pool.remote.flush()
    redis_server.stop()  # the writer's next call hangs for the 2 s timeout
    pool.delete("k")
    assert not pool.remote.flush(timeout_s=0.5)
    redis_server.resume()
    assert pool.remote.flush(timeout_s=5)


def test_bug_a_fetch_of_more_bytes_than_its_timeout_moves_was_cut_as_a_timeout(two_pools):
    """The entries' first parts come in one pipelined call whose deadline was the timeout
    alone, whatever the parts weighed: 96 MiB of KV chunks in one prefetch needs ~1 s at
    the 100 MB/s the deadlines allow (a 1 GbE link) and ~0.2 s through this machine's
    loopback, and was cut at the 100 ms timeout here (0.25 s by default). The deadline now
    allows the bytes the first parts may hold."""
    writer = two_pools("256M", write_through=True)
    reader = two_pools("256M", remote_timeout="100ms")
    keys = [f"chunk-{i}" for i in range(24)]
    for i, key in enumerate(keys):
        writer.put(key, bytes([i]) * (4 << 20))
    writer.remote.flush()
    assert reader.prefetch(keys) == len(keys)
    assert reader.remote_stats().errors == 0
    assert all(reader.get(key) == bytes([i]) * (4 << 20) for i, key in enumerate(keys))
