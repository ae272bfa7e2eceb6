"""Observers: handles that look at a pool without attaching to it (``open(observe=True)``).

Regression: ``cortex cache status``, ``stats``, ``status --watch`` and every scrape
of the Prometheus exporter opened pools as workers do, each taking a process slot
while it read: a ``destroy`` without ``--force`` landing meanwhile was refused
(for as long as a ``--watch`` ran), and each of them had to subtract itself from
the attached count. An observer takes no slot and writes nothing to the file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kvcache
from kvcache import InvalidArgument
from test_cli import CORTEX, cortex

_OBSERVE = (
    "import sys, kvcache\n"
    "pool = kvcache.open(sys.argv[1], observe=True)\n"
    "print(pool.stats().num_attached, flush=True)\n"
    "sys.stdin.readline()\n"
    "try:\n"
    "    pool.stats()\n"
    "    print('read', flush=True)\n"
    "except kvcache.PoolDestroyedError:\n"
    "    print('destroyed', flush=True)\n"
)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("tier", ["cpu", "disk"])
def test_an_observer_writes_nothing_to_the_file(
    make_pool: Callable[..., kvcache.Pool], disk: Path, tier: str
) -> None:
    where = {"tier": "disk", "path": disk} if tier == "disk" else {}
    with make_pool("4M", **where) as pool:
        pool.put("k", b"v" * 5000)
        pool.get("k")
        path = pool.path
    before = _digest(path)
    with kvcache.open(pool.name, observe=True) as observer:
        assert observer.stats().num_attached == 0
        assert observer.metrics().latency
        assert len(observer) == 1 and observer.tier == tier
    assert _digest(path) == before  # no slot, no clean mark taken, no repair
    with kvcache.open(pool.name):
        pass
    assert _digest(path) != before  # a worker's open does write: the check can fail


@pytest.mark.parametrize(
    "command",
    ["status {name}", "status", "list", "stats {name}", "entries {name}", "metrics"],
)
def test_commands_that_look_write_nothing(
    make_pool: Callable[..., kvcache.Pool], command: str
) -> None:
    with make_pool("1M") as pool:
        pool.put("k", b"v" * 5000)
    before = _digest(pool.path)
    result = cortex(*command.format(name=pool.name).split())
    assert result.returncode == 0 and result.stdout, result.stderr
    assert _digest(pool.path) == before


def test_an_observer_may_read_but_not_store(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("1M")
    pool.put("k", b"value")
    with kvcache.open(pool.name, observe=True) as observer:
        assert observer.get("k") == b"value"
        with pytest.raises(InvalidArgument, match=r"opened to observe.*without observe=True"):
            observer.put("new", b"x")
        assert pool.stats().num_attached == 1  # the observer is not counted
    assert "new" not in pool and len(pool) == 1


def test_a_forked_observer_takes_no_slot(pool_name: str) -> None:
    kvcache.create(pool_name, "1M").close()
    observer = kvcache.open(pool_name, observe=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(
                write_end, f"{observer._engine.slot} {observer.stats().num_attached}\n".encode()
            )
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as child_out:
        assert child_out.readline().split() == ["-1", "0"]
    os.waitpid(pid, 0)
    observer.close()


def test_destroy_goes_ahead_while_another_process_observes(pool_name: str) -> None:
    kvcache.create(pool_name, "1M").close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _OBSERVE, pool_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "0\n"
    kvcache.destroy(pool_name)  # not refused: nobody works in it
    out, _ = proc.communicate("go\n", timeout=30)
    assert out == "destroyed\n"
    assert pool_name not in kvcache.list_pools()


def test_destroy_while_watching_ends_the_watch_with_one_line(pool_name: str) -> None:
    kvcache.create(pool_name, "1M").close()
    watcher = subprocess.Popen(
        [CORTEX, "cache", "status", pool_name, "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watcher.stdout is not None
    assert watcher.stdout.readline().split()[0] == "TIME"
    assert watcher.stdout.readline()  # a first row: the watch has the pool open
    result = cortex("destroy", pool_name, "--yes")
    assert result.returncode == 0, result.stderr
    _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 1
    assert err.strip().splitlines() == [
        f"cortex cache: error: pool '{pool_name}' was destroyed while this process had it "
        f"open: create it again, or kvcache.open('{pool_name}') once someone has"
    ]
