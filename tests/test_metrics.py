"""``cortex cache metrics`` (Prometheus), ``stats`` and ``status --watch``: the real CLI,
scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import KVLayout, PrefixCache

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvcache import metrics  # noqa: E402
from kvcache.cli.operations import WATCH_COLUMNS  # noqa: E402

CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"
LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, dtype="float32")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def cortex(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CORTEX, "cache", *args], capture_output=True, text=True, timeout=timeout, stdin=None
    )


def samples_of(text: str, pool: str) -> Samples:
    """Every sample about ``pool`` (other pools on the machine are left out), by name and
    labels less ``pool``."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("pool") == pool:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "pool"))
                found[(s.name, labels)] = s.value
    return found


def names_of(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def busy_pool(make_pool: Callable[..., kvcache.Pool], monkeypatch: pytest.MonkeyPatch) -> str:
    """A pool with known traffic: 4 puts of 1000 bytes, 3 hits, 1 miss, 1 explicit
    eviction, PrefixCache tokens of one model; every op timed."""
    monkeypatch.setenv("KVCACHE_LATENCY_SAMPLE", "1")
    pool = make_pool("1M", page_size="4K")
    for i in range(4):
        pool.put(f"k{i}", b"x" * 1000)
    for key in ("k0", "k1", "k2", "absent"):
        pool.get(key)
    pool.evict(bytes="1")
    pc = PrefixCache(pool, "llama-3", LAYOUT, chunk_tokens=4)
    pc.store(np.arange(8), np.ones((1, 2, 1, 8, 4), np.float32))
    pc.retrieve(np.arange(10))
    pool.metrics()  # adds this process's samples to the segment
    return pool.name


def check_busy_pool(found: Samples) -> None:
    cpu = (("tier", "cpu"),)
    assert found[("kvcache_hits_total", cpu)] == 3 + 2  # the gets, and retrieve's 2 chunks
    assert found[("kvcache_misses_total", cpu)] == 1
    assert found[("kvcache_puts_total", cpu)] == 4 + 2
    assert found[("kvcache_read_bytes_total", cpu)] >= 3000
    assert found[("kvcache_evictions_total", (("reason", "explicit"), ("tier", "cpu")))] == 1
    assert found[("kvcache_evictions_total", (("reason", "capacity"), ("tier", "cpu")))] == 0
    assert found[("kvcache_size_bytes", cpu)] == 1 << 20
    model = (("model", "llama-3"), ("tier", "cpu"))
    assert found[("kvcache_prefix_query_tokens_total", model)] == 10
    assert found[("kvcache_prefix_hit_tokens_total", model)] == 8
    assert found[("kvcache_prefix_stored_tokens_total", model)] == 8
    get = (("op", "get"), ("tier", "cpu"))
    assert found[("kvcache_operation_duration_seconds_count", get)] == 4 + 2  # retrieve gets too
    inf = (("le", "+Inf"), ("op", "get"), ("tier", "cpu"))
    assert found[("kvcache_operation_duration_seconds_bucket", inf)] == 6
    assert found[("kvcache_operation_duration_seconds_count", (("op", "retrieve"), cpu[0]))] == 1


def test_metrics_once_prints_every_pool(busy_pool: str) -> None:
    result = cortex("metrics")
    assert result.returncode == 0, result.stderr
    check_busy_pool(samples_of(result.stdout, busy_pool))
    assert "# HELP kvcache_hits_total" in result.stdout


def test_the_endpoint_serves_on_loopback_and_is_scraped(busy_pool: str) -> None:
    server = subprocess.Popen(
        # any free port, host by default; --pool: other pools on this machine are not ours
        [CORTEX, "cache", "metrics", "--serve", ":0", "--pool", busy_pool],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = re.search(r"http://(\S+)/metrics", line)
        assert url and url.group(1).startswith("127.0.0.1:"), line
        with urllib.request.urlopen(f"http://{url.group(1)}/metrics", timeout=30) as response:
            assert response.status == 200
            text = response.read().decode()
        check_busy_pool(samples_of(text, busy_pool))
        with kvcache.open(busy_pool) as pool:
            pool.put("one-more", b"v")
        with urllib.request.urlopen(f"http://{url.group(1)}/metrics", timeout=30) as response:
            again = samples_of(response.read().decode(), busy_pool)
        assert again[("kvcache_puts_total", (("tier", "cpu"),))] == 7  # read at scrape time
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
    assert server.stderr is not None and server.stderr.read() == ""


def test_textfile_is_written_whole(busy_pool: str, tmp_path: Path) -> None:
    target = tmp_path / "kvcache.prom"
    result = cortex("metrics", "--textfile", str(target), "--pool", busy_pool)
    assert result.returncode == 0, result.stderr
    check_busy_pool(samples_of(target.read_text(), busy_pool))
    assert [p.name for p in tmp_path.iterdir()] == ["kvcache.prom"]  # no temporary left


def test_the_exporter_api_matches_the_command(busy_pool: str) -> None:
    check_busy_pool(samples_of(metrics.exposition(pools=[busy_pool]), busy_pool))


def test_pool_limits_the_exposition_to_the_pools_named(busy_pool: str) -> None:
    result = cortex("metrics", "--pool", busy_pool)
    assert result.returncode == 0, result.stderr
    pools = {
        s.labels["pool"]
        for family in text_string_to_metric_families(result.stdout)
        for s in family.samples
        if "pool" in s.labels
    }
    assert pools == {busy_pool}


def test_an_unreadable_pool_is_counted_not_fatal(busy_pool: str, names) -> None:
    damaged = names()
    kvcache.segment.segment_path(damaged).write_bytes(os.urandom(8192))
    # a pool destroyed between the listing and the read is gone, not unreadable
    collector = metrics.PoolCollector(names=lambda: [busy_pool, damaged, "no-such-pool"])
    families = {family.name: family for family in collector.collect()}
    assert families["kvcache_unreadable_pools"].samples[0].value == 1
    assert {s.labels["pool"] for s in families["kvcache_hits"].samples} == {busy_pool}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--serve", "localhost:http"], "give HOST:PORT"),
        (["--serve", "127.0.0.1:70000"], "give HOST:PORT"),
        (["--serve", "192.0.2.1:9464"], "cannot serve on 192.0.2.1:9464"),
        (["--textfile", "/no/such/folder/kvcache.prom"], "existing, writable folder"),
        (["--serve", ":9464", "--textfile", "x.prom"], "not allowed with"),
    ],
)
def test_bad_metrics_input_is_one_line(args: list[str], message: str) -> None:
    result = cortex("metrics", *args)
    assert result.returncode == (2 if message == "not allowed with" else 1)  # 2: does not parse
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


def test_a_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = cortex("metrics", "--serve", f"127.0.0.1:{taken.getsockname()[1]}")
    assert result.returncode == 1 and "cannot serve on" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_stats_shows_and_resets(busy_pool: str) -> None:
    result = cortex("stats", busy_pool)
    assert result.returncode == 0, result.stderr
    assert "evictions: explicit" in result.stdout and "llama-3" in result.stdout
    reset = cortex("stats", busy_pool, "--reset", "--json")
    assert reset.returncode == 0, reset.stderr
    with kvcache.open(busy_pool) as pool:
        assert (pool.stats().hits, pool.metrics().tokens) == (0, {})
        assert pool.stats().num_entries > 0


def test_stats_of_a_missing_pool_is_one_line() -> None:
    result = cortex("stats", "no-such-pool")
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1


# ------------------------------------------------------------------ status --watch


def test_watch_piped_prints_a_line_per_interval(busy_pool: str) -> None:
    result = cortex("status", busy_pool, "--watch", "--interval", "0.2", "--count", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == list(WATCH_COLUMNS)
    assert len(lines) == 4 and all(re.match(r"\s*\d\d:\d\d:\d\d\s", line) for line in lines[1:])


def test_watch_shows_the_rates_of_other_processes(busy_pool: str) -> None:
    watcher = subprocess.Popen(
        [CORTEX, "cache", "status", busy_pool, "--watch", "--interval", "0.5", "--count", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with kvcache.open(busy_pool) as pool:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            pool.get("k1")
            pool.put("k9", b"y" * 2000)
            time.sleep(0.001)
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    rows = [line.split() for line in out.splitlines()[1:]]
    assert max(float(row[1]) for row in rows) > 10  # hits/s
    assert max(float(row[3]) for row in rows) > 0  # puts/s
    assert max(float(row[4]) for row in rows) > 0  # MB/s in
    assert any(row[-1] == "1" for row in rows)  # this process attached, the watcher not counted


def test_watch_into_head_stops_quietly(busy_pool: str) -> None:
    writer = subprocess.Popen(
        [CORTEX, "cache", "status", busy_pool, "--watch", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.run(["head", "-2"], stdin=writer.stdout, capture_output=True, timeout=60)
    assert writer.stdout is not None
    writer.stdout.close()
    assert writer.wait(timeout=60) == 141
    assert writer.stderr is not None and writer.stderr.read() == b""
    assert head.stdout.decode().count("\n") == 2


def test_watch_on_a_terminal_redraws_with_rich(busy_pool: str) -> None:
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [CORTEX, "cache", "status", busy_pool, "--watch", "--interval", "0.1", "--count", "3"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "120", "LINES": "30", "TERM": "xterm"},
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    assert b"HITS/S" in shown and b"\x1b[" in shown  # rich's cursor moves: redrawn in place


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "soon"], "--interval"),
        (["--json"], "leave out --json"),
        (["--count", "0"], "--count"),
    ],
)
def test_bad_watch_input_is_one_line(busy_pool: str, args: list[str], message: str) -> None:
    result = cortex("status", busy_pool, "--watch", *args)
    assert result.returncode == (2 if args[0] == "--count" else 1)  # 2: does not parse
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


def test_watch_needs_a_pool() -> None:
    result = cortex("status", "--watch")
    assert result.returncode == 1 and "needs a pool" in result.stderr
