"""``cortex cache metrics`` (Prometheus), ``stats`` and ``status --watch``: the real CLI,
scraped over HTTP and parsed with prometheus_client's own parser."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def serving(pool: str, **popen: Any) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``cortex cache metrics --serve`` of ``pool`` on any free loopback port: the process
    and its ``host:port``. Killed afterwards if a test left it running."""
    server = subprocess.Popen(
        # any free port, host by default; --pool: other pools on this machine are not ours
        [CORTEX, "cache", "metrics", "--serve", ":0", "--pool", pool],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        address = re.search(r"http://(\S+)/metrics", line)
        assert address and address.group(1).startswith("127.0.0.1:"), line
        yield server, address.group(1)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()


def stopped_cleanly(server: subprocess.Popen[str], signum: int) -> None:
    """Send ``signum``; the server must end at once, with status 0 and nothing on stderr."""
    server.send_signal(signum)
    assert server.wait(timeout=30) == 0
    assert server.stderr is not None and server.stderr.read() == ""


def scrape(address: str, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_endpoint_serves_on_loopback_and_is_scraped(busy_pool: str) -> None:
    with serving(busy_pool) as (server, address):
        status, text = scrape(address)
        assert status == 200
        check_busy_pool(samples_of(text, busy_pool))
        with kvcache.open(busy_pool) as pool:
            pool.put("one-more", b"v")
        again = samples_of(scrape(address)[1], busy_pool)
        assert again[("kvcache_puts_total", (("tier", "cpu"),))] == 7  # read at scrape time
        stopped_cleanly(server, signal.SIGTERM)  # as systemd and timeout stop it


def test_bug_an_exporter_started_with_sigint_ignored_never_stopped(busy_pool: str) -> None:
    # as `cortex cache metrics --serve ... &` in a script, or nohup, starts it
    ignoring = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    with serving(busy_pool, **ignoring) as (server, _):
        stopped_cleanly(server, signal.SIGINT)


@pytest.mark.parametrize("path", ["/", "/favicon.ico", "/metrics/", "/anything", "/../metrics"])
def test_bug_every_path_answered_with_the_exposition(busy_pool: str, path: str) -> None:
    with serving(busy_pool) as (server, address):
        status, text = scrape(address, path)
        assert status == 404 and "/metrics" in text and "kvcache_" not in text
        assert scrape(address, "/metrics?name[]=kvcache_hits_total")[0] == 200
        stopped_cleanly(server, signal.SIGTERM)


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _accept_queue(port: int) -> int:
    """Connections to ``port`` (IPv4 loopback) the kernel holds that the server has not
    yet accepted: its listening socket's receive queue in /proc/net/tcp."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.rpartition(":")[2], 16) == port:  # LISTEN
            return int(queues.partition(":")[2], 16)
    raise AssertionError(f"nothing listens on port {port}")


def _until_scraped(address: str, timeout_s: float = 30) -> None:
    """Scrape until answered, as Prometheus does at each interval (a connection that
    found the queue full is closed unanswered)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            assert scrape(address)[0] == 200
            return
        except (ConnectionError, urllib.error.URLError):
            assert time.monotonic() < deadline, "never answered"
            time.sleep(0.1)


def test_bug_300_idle_connections_made_300_threads(busy_pool: str) -> None:
    with serving(busy_pool) as (server, address):
        port = int(address.rpartition(":")[2])
        idle: list[socket.socket] = []
        try:
            for i in range(300):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
                if i % 2:
                    idle[-1].sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            deadline = time.monotonic() + 30
            while _accept_queue(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _accept_queue(port) == 0, "the server stopped accepting"
            assert _threads(server.pid) < 20  # a few, not one per connection
        finally:
            for connection in idle:
                connection.close()
        _until_scraped(address)  # the idle ones held nothing for good
        stopped_cleanly(server, signal.SIGTERM)


def _closed_by_peer(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_client_that_drips_its_request_is_cut_off(busy_pool: str) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"  # a byte a second: 34 s
    with serving(busy_pool) as (server, address):
        port = int(address.rpartition(":")[2])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as dripping:
            sent = 0
            while sent < len(request) and not select.select([dripping], [], [], 1)[0]:
                with contextlib.suppress(OSError):  # cut while sending
                    dripping.sendall(request[sent : sent + 1])
                sent += 1
            assert sent < len(request) and _closed_by_peer(dripping), "served to the end"
        stopped_cleanly(server, signal.SIGTERM)


def test_a_closed_server_frees_its_port_and_its_threads(busy_pool: str) -> None:
    before = {thread.ident for thread in threading.enumerate()}
    server = metrics.Server("127.0.0.1", 0, pools=[busy_pool])
    assert scrape(f"127.0.0.1:{server.port}")[0] == 200
    server.close()
    deadline = time.monotonic() + 30
    while {t.ident for t in threading.enumerate()} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {thread.ident for thread in threading.enumerate()} <= before
    with socket.socket() as again:  # as a restarted exporter binds it (TIME_WAIT allowed)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", server.port))


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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_bug_watch_did_not_stop_cleanly_on_sigterm_or_on_an_ignored_sigint(
    busy_pool: str, signum: int
) -> None:
    watcher = subprocess.Popen(
        [CORTEX, "cache", "status", busy_pool, "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as `... --watch &` in a script starts it: SIGINT ignored, yet it must stop on it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().split() == list(WATCH_COLUMNS)  # watching
        stopped_cleanly(watcher, signum)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()


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
