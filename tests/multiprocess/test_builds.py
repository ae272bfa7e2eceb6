"""Hidden files of builders that died are removed; those of live builders never are.

A create or restore builds its pool under ``.kvcache.<name>.<hex>`` and a
persist writes ``.<snapshot>.<hex>.tmp``, each holding a kernel lease (an OFD
lock) on its file until the file has its final name. Real children are
SIGKILLed mid-build here; ``cortex cache list``, ``create`` and the next
persist must then remove what they left, and must leave alone the file of a
builder that still runs, however old it looks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from workers import wait_for_line

import kvcache
from kvcache import builds, segment

CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"

CHILD_RESTORE_AND_HANG = """
import sys, time
import kvcache
def hang(done, total):
    print("ready", flush=True)
    time.sleep(3600)
kvcache.restore(sys.argv[1], sys.argv[2], progress=hang)
"""

CHILD_PERSIST_AND_HANG = """
import sys, time
import kvcache
def hang(done, total):
    print("ready", flush=True)
    time.sleep(3600)
kvcache.persist(kvcache.open(sys.argv[1]), sys.argv[2], progress=hang)
"""

CHILD_CREATE = """
import sys
import kvcache
print("ready", flush=True)
kvcache.create(sys.argv[1], sys.argv[2], prealloc=True)
"""


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen]]:
    """Child processes of the test, SIGKILLed and reaped afterwards if still running."""
    started: list[subprocess.Popen] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def _start(
    children: list[subprocess.Popen], code: str, *args: str, own_pids: bool = False
) -> subprocess.Popen:
    """Run ``code`` in a child; with ``own_pids``, in a PID namespace of its own (as a
    container of the same pod would: same /dev/shm, pids that mean nothing here)."""
    command = [sys.executable, "-c", code, *args]
    if own_pids:
        command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children.append(child)
    return child


def _kill(child: subprocess.Popen) -> None:
    """SIGKILL the builder, in its namespace if it has one, and wait until it is gone."""
    inner = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
    os.kill(int(inner[0]) if inner else child.pid, signal.SIGKILL)  # under unshare: its child
    child.wait(timeout=30)  # unshare exits once it has reaped the builder
    assert child.returncode != 0


def _hidden(name: str) -> list[Path]:
    return sorted(segment.shm_dir().glob(f".kvcache.{name}.*"))


def _make_old(paths: list[Path]) -> None:
    """Modification times a minute back: too old to be a builder yet to take its lease."""
    then = time.time() - 60
    for path in paths:
        os.utime(path, (then, then))


def _cortex_list() -> None:
    result = subprocess.run([CORTEX, "cache", "list"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_killed_restore_leaves_nothing_after_the_next_list(
    make_pool, pool_name, tmp_path, children
):
    pool = make_pool("8M", page_size="4K")
    for i in range(20):
        pool.put(f"k{i}", bytes([i]) * 5000)
    snapshot = kvcache.persist(pool, tmp_path / "pool.kvsnap")
    target = f"{pool_name}-restored"
    child = _start(children, CHILD_RESTORE_AND_HANG, target, str(snapshot), own_pids=True)
    try:
        wait_for_line(child, "ready", timeout=60)  # mid-restore, its hidden pool half filled
        hidden = _hidden(target)
        assert len(hidden) == 1
        _make_old(hidden)  # only the lease can keep it now
        _cortex_list()
        with kvcache.create(f"{pool_name}-other", "64K"):
            pass
        kvcache.destroy(f"{pool_name}-other")
        assert _hidden(target) == hidden, "a live restore's pool was removed"

        _kill(child)
        assert _hidden(target) == hidden  # the dead builder's file is still there...
        _cortex_list()
        assert _hidden(target) == []  # ...until the next list
        assert target not in kvcache.list_pools()
    finally:
        for path in _hidden(target):
            path.unlink()


def test_a_create_killed_while_reserving_is_cleaned_up_by_the_next_create(pool_name, children):
    child = _start(children, CHILD_CREATE, pool_name, "3G")
    try:
        wait_for_line(child, "ready", timeout=60)
        hidden: list[Path] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            hidden = _hidden(pool_name)
            if hidden and hidden[0].stat().st_blocks * 512 >= 64 << 20:
                break  # reserving, and far from done (3 GiB at ~3 GB/s)
            time.sleep(0.001)
        _kill(child)
        assert pool_name not in kvcache.list_pools(), "the create finished before the kill"
        assert len(hidden) == 1
        _make_old(hidden)
        with kvcache.create(f"{pool_name}-next", "64K"):
            pass
        kvcache.destroy(f"{pool_name}-next")
        assert _hidden(pool_name) == []
    finally:
        for path in _hidden(pool_name):
            path.unlink()


def test_a_live_persists_temporary_file_survives_another_persist(make_pool, tmp_path, children):
    """Regression: temporary files were judged by the pid and start time in their name, so
    a persist running in another PID namespace (pid 1 there) was taken for dead."""
    pool = make_pool("4M", page_size="4K")
    pool.put("k", b"v" * 10_000)
    target = tmp_path / "pool.kvsnap"
    child = _start(children, CHILD_PERSIST_AND_HANG, pool.name, str(target), own_pids=True)
    wait_for_line(child, "ready", timeout=60)
    temps = sorted(tmp_path.glob(".pool.kvsnap.*.tmp"))
    assert len(temps) == 1
    _make_old(temps)
    kvcache.persist(pool, target)
    assert sorted(tmp_path.glob(".pool.kvsnap.*.tmp")) == temps, "a live writer's file went"

    _kill(child)
    kvcache.persist(pool, target)
    assert sorted(os.listdir(tmp_path)) == [target.name]
    assert kvcache.inspect_snapshot(target).num_entries == 1


def test_a_young_unleased_file_is_left_for_its_builder_to_lease(pool_name):
    """Between ``open(O_CREAT|O_EXCL)`` and taking the lease, a live builder's file is
    unleased: only its age tells it apart from an abandoned one."""
    path = segment.shm_dir() / f".kvcache.{pool_name}.{uuid.uuid4().hex[:12]}"
    path.write_bytes(b"")
    try:
        assert builds.remove_abandoned([path], min_age_s=3600) == []
        assert path.exists()
        assert builds.remove_abandoned([path], min_age_s=0) == [path]
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_only_regular_files_under_hidden_names_are_removed(pool_name, tmp_path):
    folder = segment.shm_dir()
    odd = [folder / f".kvcache.{pool_name}.{tag * 6}" for tag in ("ab", "cd")]
    odd[0].mkdir()
    odd[1].symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"keep")
    try:
        assert builds.remove_abandoned(odd, min_age_s=0) == []
        kvcache.list_pools()
        assert all(os.path.lexists(path) for path in odd)
        assert (tmp_path / "elsewhere").read_bytes() == b"keep"
    finally:
        odd[0].rmdir()
        odd[1].unlink()
