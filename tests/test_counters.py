"""Operational counters in the segment (format 6): shared, lasting, reset only on request."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

import kvcache
from kvcache import (
    IncompatiblePoolError,
    InvalidArgument,
    KVLayout,
    PoolConfig,
    PoolFullError,
    PrefixCache,
)
from kvcache.counters import (
    LATENCY_BOUNDS_S,
    MAX_MODELS,
    METRICS_DTYPE,
    NUM_BUCKETS,
    SAMPLE_ENV,
    M,
    bucket_of,
)
from kvcache.layout import FORMAT_VERSION, HEADER_BYTES, METRICS_BYTES, METRICS_OFFSET, Geometry
from kvcache.reports import Histogram, Rates
from pool_files import set_format_version

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")


@pytest.fixture(autouse=True)
def every_op_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAMPLE_ENV, "1")


def test_region_follows_the_header_and_fits() -> None:
    assert METRICS_OFFSET == HEADER_BYTES
    assert METRICS_DTYPE.itemsize <= METRICS_BYTES
    assert FORMAT_VERSION == 13
    geometry = Geometry.for_config(PoolConfig.build("1M", page_size="4K"))
    assert geometry.procs_offset == METRICS_OFFSET + METRICS_BYTES  # nothing else in it


def test_buckets_are_powers_of_two_microseconds() -> None:
    assert len(LATENCY_BOUNDS_S) == NUM_BUCKETS - 1
    assert bucket_of(0) == bucket_of(1) == bucket_of(1000) == 0
    assert bucket_of(1001) == bucket_of(2000) == 1
    assert bucket_of(2001) == 2
    for i, bound in enumerate(LATENCY_BOUNDS_S):
        assert bucket_of(round(bound * 1e9)) == i
    assert bucket_of(10**12) == NUM_BUCKETS - 1  # +Inf


def test_bytes_in_and_out_and_explicit_evictions(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    for i in range(10):
        pool.put(f"k{i}", b"x" * 1000)
    assert pool.get("k0") == b"x" * 1000
    assert pool.get("absent") is None
    stats = pool.stats()
    assert (stats.bytes_in, stats.bytes_out, stats.hits, stats.misses) == (10_000, 1000, 1, 1)
    assert pool.evict(percent=50).num_entries == 5
    stats = pool.stats()
    assert stats.evictions == stats.evictions_explicit == 5


def test_a_refused_put_is_an_error(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    pool._engine.slot = -1  # as a child forked while every process slot was taken
    with pytest.raises(PoolFullError):
        pool.put("k", b"v")
    assert pool.stats().errors == 1


def test_latency_histograms_count_every_sampled_op(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    for i in range(20):
        pool.put(f"k{i}", b"v" * 100)
        pool.get(f"k{i}")
    pool.get_into("k0", bytearray(100))
    latency = pool.metrics().latency
    assert latency["put"].count == 20 and latency["get"].count == 21
    assert latency["lookup"].count == latency["retrieve"].count == 0
    assert 0 < latency["get"].sum_s < 1


@pytest.mark.parametrize("every", [1, 2, 4])
def test_one_call_in_every_is_timed_for_each_op(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    monkeypatch.setenv(SAMPLE_ENV, str(every))
    pool = make_pool("1M", page_size="4K")
    for i in range(12):
        pool.put(f"k{i}", b"v")
        pool.get(f"k{i}")
        pool.get_into(f"k{i}", bytearray(1))
    latency = pool.metrics().latency
    assert latency["put"].count == 12 // every
    assert latency["get"].count == 24 // every  # get and get_into share a countdown
    assert pool.stats().hits == 24  # a timed call is counted once


def test_sampling_off_times_nothing(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SAMPLE_ENV, "0")
    pool = make_pool("1M", page_size="4K")
    for i in range(50):
        pool.put(f"k{i}", b"v")
    assert pool.metrics().latency["put"].count == 0


def test_a_bad_sampling_setting_is_refused(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_pool("1M", page_size="4K").name
    with monkeypatch.context() as patch:
        patch.setenv(SAMPLE_ENV, "often")
        with pytest.raises(InvalidArgument, match=SAMPLE_ENV):
            kvcache.open(name)


def test_bytes_wait_in_the_process_until_a_sample_stats_or_close(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SAMPLE_ENV, "4")
    pool = make_pool("1M", page_size="4K")
    pool.put("k", b"v" * 10)
    other = kvcache.open(pool.name)
    try:
        assert other.stats().bytes_in == 0  # kept back in the writer
        assert pool.stats().bytes_in == 10  # stats() adds its own first
        assert other.stats().bytes_in == 10
        for _ in range(3):
            pool.get("k")
        assert other.stats().bytes_out == 0 and other.stats().hits == 3
        pool.get("k")  # the 4th get is timed: its sample brings the bytes kept back
        assert other.stats().bytes_out == 40
        assert other.metrics().latency["get"].count == 1
        pool.get("k")
        pool.close()
        assert other.stats().bytes_out == 50  # close adds what is left
    finally:
        other.close()


def test_a_forked_child_adds_only_its_own_bytes(
    make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SAMPLE_ENV, "0")
    pool = make_pool("1M", page_size="4K")
    pool.put("k", b"v" * 10)  # kept back in this process when the child is forked
    pid = os.fork()
    if pid == 0:  # the child: one get, then exit through close
        code = 0
        try:
            pool.get("k")
            pool.close()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stats = pool.stats()
    assert (stats.bytes_in, stats.bytes_out) == (10, 10)  # the put's 10 counted once


def test_tokens_by_model_with_bounded_labels(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("4M", page_size="4K")
    tokens = np.arange(10)
    kv = np.ones((1, 2, 1, 10, 4), np.float32)
    pc = PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=4)
    assert pc.store(tokens, kv) == 8
    assert pc.lookup(tokens) == 8
    assert pc.retrieve(tokens)[1] == 8
    assert pc.retrieve(np.arange(100, 110))[1] == 0
    metrics = pool.metrics()
    counts = metrics.tokens["model-a"]
    assert (counts.queried, counts.hit, counts.stored) == (20, 8, 8)
    assert metrics.latency["lookup"].count == 1 and metrics.latency["retrieve"].count == 2
    for i in range(MAX_MODELS + 3):
        pool.count_tokens(f"m{i}", queried=1)
    tokens_by_model = pool.metrics().tokens
    assert len(tokens_by_model) == MAX_MODELS + 1
    assert tokens_by_model["other"].queried == 4  # m15 .. m18: model-a holds a row
    assert "m14" in tokens_by_model and "m15" not in tokens_by_model


def test_counters_are_shared_and_outlive_processes(pool_name: str) -> None:
    kvcache.create(pool_name, "1M", page_size="4K").close()
    script = (
        "import kvcache\n"
        f"p = kvcache.open({pool_name!r})\n"
        "p.put('k', b'abc'); p.get('k'); p.count_tokens('m', queried=5, hit=4)\n"
        "p.close()\n"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", script], check=True)
    with kvcache.open(pool_name) as pool:
        stats, metrics = pool.stats(), pool.metrics()
        assert (stats.puts, stats.hits, stats.bytes_in, stats.bytes_out) == (2, 2, 6, 6)
        assert metrics.latency["put"].count == 2  # flushed at close
        assert metrics.tokens["m"].queried == 10


def test_reset_zeroes_every_counter(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    pool.put("k", b"v")
    pool.get("k")
    pool.count_tokens("m", stored=3)
    assert pool.metrics().reset_at is None
    pool.reset_stats()
    stats, metrics = pool.stats(), pool.metrics()
    assert (stats.puts, stats.hits, stats.bytes_in, stats.bytes_out) == (0, 0, 0, 0)
    assert metrics.tokens == {} and metrics.latency["get"].count == 0
    assert metrics.reset_at is not None
    assert stats.num_entries == 1  # the entries stay


def test_repair_zeroes_negative_counters(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    pool._engine.metrics.q[M.bytes_in] = -5
    pool._engine.metrics.q[M.latency + 3] = -1
    pool._engine.views.header_q[0 + kvcache.layout.H.dirty] = 1  # as if a holder died
    assert pool.stats().bytes_in == 0
    assert pool.metrics().latency["get"].counts[3] == 0


@pytest.mark.parametrize("older", [5, 6, 7, 8, 9, 11])
def test_older_format_pools_are_refused(pool_name: str, older: int) -> None:
    with kvcache.create(pool_name, "1M", page_size="4K") as pool:
        path = pool.path
    set_format_version(path, older)
    with pytest.raises(
        IncompatiblePoolError,
        match=f"format version {older}, this kvcache reads 10, 12 and {FORMAT_VERSION}",
    ):
        kvcache.open(pool_name)


def test_quantiles_are_bucket_bounds() -> None:
    histogram = Histogram((0, 90, 0, 9, *([0] * (NUM_BUCKETS - 5)), 1), 0.5)
    assert histogram.count == 100 and histogram.mean_s == 0.005
    assert histogram.quantile(0.5) == LATENCY_BOUNDS_S[1]
    assert histogram.quantile(0.95) == LATENCY_BOUNDS_S[3]
    assert histogram.quantile(1.0) == math.inf
    assert Histogram((0,) * NUM_BUCKETS, 0.0).quantile(0.5) == 0.0


def test_rates_between_two_readings(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    before = pool.stats()
    for i in range(10):
        pool.put(f"k{i}", b"x" * 100)
        pool.get(f"k{i}")
    rates = Rates.between(before, pool.stats(), 2.0)
    assert (rates.hits_per_s, rates.puts_per_s, rates.in_bytes_per_s) == (5.0, 5.0, 500.0)
    pool.reset_stats()
    after_reset = Rates.between(before, pool.stats(), 1.0)  # went down: counted from zero
    assert after_reset.hits_per_s == 0.0


def test_close_unmaps_the_pool(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M", page_size="4K")
    pool.put("k", b"v")
    segment = pool._segment
    pool.close()
    assert segment.buffer.closed  # no view of the metrics region kept it mapped


def test_a_forked_child_does_not_add_its_parents_samples_again(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    pool = make_pool("1M", page_size="4K")
    pool.put("k", b"v")  # one sample waiting in this process
    pid = os.fork()
    if pid == 0:
        pool.close()  # the child's close flushes what the child has: nothing
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert pool.metrics().latency["put"].count == 1
