"""Faults of a real redis-server under a pool: stopped (SIGSTOP), killed (SIGKILL),
restarted empty, out of memory, evicting parts of values. Every one is a miss for the
caller, never an exception and never a hang; the pool keeps working on its local tiers,
warns once, counts it, and comes back when Redis does.

The ``HANG_GUARD_S`` bounds are not timing assertions: a call that took that long would
have hung (the timeouts in play are a fraction of a second)."""

from __future__ import annotations

import logging
import os
import time

import pytest

import kvcache

NS = "faults"
HANG_GUARD_S = 5.0


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    """Retry a down remote after 50 ms, not 0.5 s (the constant, not a mock of anything)."""
    monkeypatch.setattr("kvcache.remote.link.FIRST_BACKOFF_S", 0.05)
    monkeypatch.setattr("kvcache.remote.link.MAX_BACKOFF_S", 0.1)


@pytest.fixture
def pools(names, redis_server):
    made: list[kvcache.Pool] = []

    def make(size: str = "4M", **options: object) -> kvcache.Pool:
        options.setdefault("remote_timeout", "100ms")
        made.append(
            kvcache.create(names(), size, remote=redis_server.url, namespace=NS, **options)  # type: ignore[arg-type]
        )
        return made[-1]

    yield make
    for pool in made:
        pool.close()


def timed(call):
    started = time.monotonic()
    result = call()
    elapsed = time.monotonic() - started
    assert elapsed < HANG_GUARD_S, f"the call hung for {elapsed:.1f} s"
    return result


def wait_until(condition, what: str, seconds: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.02)


def test_a_stopped_redis_is_a_miss_the_pool_works_locally_and_it_comes_back(
    pools, redis_server, caplog
):
    writer, reader = pools(write_through=True), pools()
    writer.put("shared", b"from a")
    writer.remote.flush()
    reader.put("local", b"here")
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="kvcache.remote.link"):
        assert timed(lambda: reader.get("shared")) is None  # one timeout, then down
        assert timed(lambda: reader.get("local")) == b"here"
        assert timed(lambda: reader.get("other")) is None
        assert timed(lambda: "shared" in reader) is False
        assert timed(lambda: reader.count_present(["shared", "x"])) == 0
        stats = reader.remote_stats()
        assert not stats.up and stats.errors >= 1 and "Timeout" in (stats.problem or "")
        redis_server.resume()
        wait_until(lambda: reader.get("shared") == b"from a", "reading from the resumed redis")
    assert reader.remote_stats().up
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is down" in m for m in messages) == 1
    assert any("is back" in m for m in messages)


def test_puts_do_not_wait_for_a_stopped_redis(pools, redis_server):
    pool = pools(write_through=True, remote_timeout="2s")
    redis_server.stop()
    value = os.urandom(50_000)
    for i in range(20):
        timed(lambda i=i: pool.put(f"k{i}", value))  # queued: the writer waits, not the caller
    assert all(pool.get(f"k{i}") == value for i in range(20))
    redis_server.resume()
    assert pool.remote.flush(timeout_s=HANG_GUARD_S)


def test_a_killed_redis_then_restarted_empty_is_used_again(pools, redis_server):
    writer, reader = pools(write_through=True), pools()
    writer.put("before", b"1")
    writer.remote.flush()
    redis_server.kill()
    assert timed(lambda: reader.get("before")) is None
    assert not reader.remote_stats().up
    writer.put("while-down", b"2")  # dropped or failed: counted, never raised
    timed(lambda: writer.remote.flush(timeout_s=HANG_GUARD_S))
    redis_server.restart()  # same port, nothing in it
    wait_until(lambda: reader.remote.ping() is not None, "reconnecting")
    assert reader.get("before") is None  # gone with the old server: a miss
    writer.put("after", b"3")
    wait_until(lambda: writer.remote.flush() and reader.get("after") == b"3", "a new write")
    assert writer.remote_stats().errors >= 1


def test_out_of_memory_errors_drop_writes_and_leave_reads_working(pools, redis_server):
    writer, reader = pools(write_through=True), pools()
    writer.put("early", b"fits")
    writer.remote.flush()
    redis_server.config_set("maxmemory-policy", "noeviction")
    redis_server.config_set("maxmemory", 1)  # every write is now refused with OOM
    writer.put("late", os.urandom(10_000))
    timed(lambda: writer.remote.flush(timeout_s=HANG_GUARD_S))
    stats = writer.remote_stats()
    assert stats.dropped >= 1 and stats.errors >= 1 and "OutOfMemory" in (stats.problem or "")
    assert writer.get("late") is not None  # the local copy is untouched
    assert reader.get("late") is None
    redis_server.config_set("maxmemory", 0)
    wait_until(lambda: reader.get("early") == b"fits", "reads after the OOM")


def test_redis_evicting_parts_of_values_never_gives_a_wrong_value(pools, redis_server):
    redis_server.config_set("maxmemory-policy", "allkeys-random")
    redis_server.config_set("maxmemory", 4 << 20)
    writer = pools(size="64M", write_through=True)
    writer.remote.part_bytes = 16 * 1024
    values = {f"k{i}": os.urandom(200_000) for i in range(60)}  # 12 MB into 4 MB
    for key, value in values.items():
        writer.put(key, value)
        writer.remote.flush()
    client = redis_server.client()
    assert client.info("stats")["evicted_keys"] > 0
    reader = pools(size="64M")
    found = {key: reader.get(key) for key in values}
    assert all(got is None or got == values[key] for key, got in found.items())
    assert any(got is None for got in found.values())
    reader.remote.flush()
    stats = reader.remote_stats()
    assert stats.misses == sum(got is None for got in found.values())
    assert 1 <= stats.damaged <= stats.misses  # torn by Redis's eviction, then deleted
