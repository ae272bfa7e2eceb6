"""``cortex cache`` reports who is attached, when entries were used and what is damaged.

Regressions: ``status`` listed its own process as attached, had no way to show
processes of other PID namespaces, and ``entries`` showed logical-clock ticks
as LAST-ACCESS (``--json`` called them times), and ``health`` passed damaged bytes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

import kvcache
from test_cli import cortex, cortex_json

_HOLD_OPEN = (
    "import sys, kvcache; p = kvcache.open(sys.argv[1]); print('ready', flush=True); "
    "sys.stdin.read()"
)


@pytest.fixture
def holder(pool_name: str) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a process (under an optional wrapper) that keeps the pool open."""
    started: list[subprocess.Popen[str]] = []

    def start(*wrapper: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [*wrapper, sys.executable, "-c", _HOLD_OPEN, pool_name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.communicate(timeout=20)


def _attached_row(name: str) -> str:
    result = cortex("status", name)
    assert result.returncode == 0, result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("attached"))


def test_status_lists_other_processes_but_not_itself(pool_name: str, holder) -> None:
    kvcache.create(pool_name, "1M").close()
    assert _attached_row(pool_name).split() == ["attached", "none"]
    assert cortex_json("status", pool_name)["attached"] == []
    proc = holder()
    assert _attached_row(pool_name).split() == ["attached", str(proc.pid)]
    doc = cortex_json("status", pool_name)
    assert doc["attached"] == [proc.pid] and doc["num_attached"] == 1


def test_status_counts_processes_of_other_pid_namespaces(pool_name: str, holder) -> None:
    kvcache.create(pool_name, "1M").close()
    holder("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
    assert _attached_row(pool_name).split()[1:] == ["1", "in", "other", "PID", "namespaces"]
    doc = cortex_json("status", pool_name)
    assert doc["attached"] == [] and doc["num_attached"] == 1


def test_entries_show_wall_clock_times(pool_name: str) -> None:
    before = time.time()
    with kvcache.create(pool_name, "1M") as pool:
        pool.put("old", b"1")
        pool.put("new", b"2")
        after_put = time.time()
        time.sleep(0.05)
        pool.get("old")
    listed = {e["key"]: e for e in cortex_json("entries", pool_name)["entries"]}
    old, new = listed["old"], listed["new"]
    assert before <= old["created_at"] <= new["created_at"] <= after_put
    assert old["accessed_at"] > after_put  # the hit moved it; the put did not
    assert new["accessed_at"] == new["created_at"]
    table = cortex("entries", pool_name).stdout
    assert "CREATED" in table and "s ago" in table


def test_health_reports_and_repairs_damaged_bytes(pool_name: str) -> None:
    """Regression: bytes changed behind the pool's back passed as "consistent"."""
    with kvcache.create(pool_name, "1M", page_size="4K") as pool:
        pool.put("kept", b"k" * 3000)
        pool.put("hit", b"h" * 3000)
        _, payload, _ = pool._engine.table.value_views(pool._engine.table.find(b"hit"))
        payload.views[0][100] ^= 0xFF  # a stray write into the shared pages
    result = cortex("health", pool_name)
    assert result.returncode == 1
    assert "'hit'" in result.stdout and "checksum" in result.stdout
    assert cortex_json("health", pool_name, "--repair")["repaired"] is True
    assert cortex_json("health", pool_name)["consistent"] is True
    with kvcache.open(pool_name) as pool:
        assert pool.get("kept") == b"k" * 3000 and "hit" not in pool


def test_bug_destroy_with_processes_attached_succeeded_silently(pool_name: str, holder) -> None:
    """Their work went into the unlinked file; now destroy names them and needs --force."""
    kvcache.create(pool_name, "1M").close()
    proc = holder()
    refused = cortex("destroy", pool_name, "--yes")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"is open in 1 other process(es) ({proc.pid})" in refused.stderr
    assert "--force" in refused.stderr
    assert pool_name in kvcache.list_pools()
    assert cortex_json("destroy", pool_name, "--yes", "--force")["destroyed"] == pool_name
    assert pool_name not in kvcache.list_pools()


def test_processes_of_other_pid_namespaces_count_as_attached(pool_name: str, holder) -> None:
    kvcache.create(pool_name, "1M").close()
    holder("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
    refused = cortex("destroy", pool_name, "--yes")
    assert refused.returncode == 1
    assert "is open in 1 other process(es) (1 in other PID namespaces)" in refused.stderr


def test_bug_restore_replace_with_processes_attached_succeeded_silently(
    pool_name: str, holder, tmp_path
) -> None:
    with kvcache.create(pool_name, "1M") as pool:
        pool.put("k", b"snapshot")
        snapshot = str(kvcache.persist(pool, tmp_path / "s.kvsnap"))
        pool.put("k", b"live")
    proc = holder()
    refused = cortex("restore", pool_name, "--path", snapshot, "--replace")
    assert refused.returncode == 1, refused.stderr
    assert f"({proc.pid})" in refused.stderr and "to replace it anyway" in refused.stderr
    with kvcache.open(pool_name) as pool:
        assert pool.get("k") == b"live"
    cortex_json("restore", pool_name, "--path", snapshot, "--replace", "--force")
    with kvcache.open(pool_name) as pool:
        assert pool.get("k") == b"snapshot"
