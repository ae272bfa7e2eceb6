"""procs: process identity (pid + start time), liveness and the attached-process table."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvcache
from kvcache import PoolFullError
from kvcache.procs import ProcessTable, is_alive, me, start_time


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live child process that exits when its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _exit_and_become_zombie(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    deadline = time.monotonic() + 10
    while _state(proc.pid) != "Z":
        assert time.monotonic() < deadline, "child did not exit"
        time.sleep(0.005)


def test_start_time_of_self() -> None:
    pid = os.getpid()
    start = start_time(pid)
    assert start > 0
    assert start_time(pid) == start  # stable
    assert me() == (pid, start)
    assert is_alive(pid, start)


def test_start_time_of_missing_process() -> None:
    assert start_time(2**22 + 12345) == -1  # above any pid_max
    assert start_time(0) == -1
    assert start_time(-1) == -1


def test_reused_pid_is_not_alive() -> None:
    pid, start = me()
    assert not is_alive(pid, start + 1)
    assert not is_alive(pid, start - 1)
    assert not is_alive(pid, 0)


@pytest.mark.parametrize("pid", [0, -1, -os.getpid(), 2**22 + 12345])
def test_impossible_pids_are_not_alive(pid: int) -> None:
    assert not is_alive(pid, start_time(os.getpid()))


def test_child_alive_then_zombie_then_gone(child: subprocess.Popen[bytes]) -> None:
    start = start_time(child.pid)
    assert start >= start_time(os.getpid())  # started after us
    assert is_alive(child.pid, start)
    _exit_and_become_zombie(child)
    assert start_time(child.pid) == start  # a zombie still has its /proc entry...
    assert not is_alive(child.pid, start)  # ...but counts as dead
    child.wait()
    assert start_time(child.pid) == -1
    assert not is_alive(child.pid, start)


def test_process_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    """/proc/<pid>/stat puts the command name in parentheses; it may contain both."""
    odd = tmp_path / "a) b (c"
    odd.symlink_to(sys.executable)
    proc = subprocess.Popen([str(odd), "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            assert b"(a) b (c)" in f.read()  # the trap is really there
        start = start_time(proc.pid)
        assert start >= start_time(os.getpid())
        assert is_alive(proc.pid, start)
        assert not is_alive(proc.pid, start + 1)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    assert not is_alive(proc.pid, start)


def test_me_is_refreshed_after_fork() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report me() and whether it matches its own pid and start time
        try:
            mine = me()
            ok = mine == (os.getpid(), start_time(os.getpid())) and mine[0] != os.getppid()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert me() == (os.getpid(), start_time(os.getpid()))


@pytest.fixture
def table(make_pool: Callable[..., kvcache.Pool]) -> ProcessTable:
    """The process table of a real pool, emptied of the test process's own attachment."""
    pool = make_pool("64K", page_size="1K")
    procs = pool._views.procs
    procs[:] = (0, 0)
    return ProcessTable(procs)


def _rows(table: ProcessTable) -> list[tuple[int, int]]:
    rows = table._table[table._table["pid"] != 0]
    return [(int(pid), int(start)) for pid, start in rows]


def test_pool_attaches_its_process(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("64K", page_size="1K")
    assert ProcessTable(pool._views.procs).live_pids() == [os.getpid()]
    assert pool.stats().attached == (os.getpid(),)


def test_attach_detach(table: ProcessTable) -> None:
    pid, start = me()
    table.attach(pid, start)
    table.attach(pid, start)  # a process may open a pool twice
    assert _rows(table) == [(pid, start), (pid, start)]
    assert table.live_pids() == [pid]  # each pid once
    table.detach(pid, start)
    assert _rows(table) == [(pid, start)]
    table.detach(pid, start + 1)  # not this process: nothing happens
    assert _rows(table) == [(pid, start)]
    table.detach(pid, start)
    assert _rows(table) == []
    assert table.live_pids() == []
    table.detach(pid, start)  # detaching what is not there is harmless


def test_attach_reuses_the_first_free_slot(table: ProcessTable) -> None:
    pid, start = me()
    for _ in range(3):
        table.attach(pid, start)
    table._table[1] = (0, 0)
    table.attach(pid, start)
    assert int(table._table["pid"][1]) == pid
    assert int(table._table["pid"][3]) == 0


def test_prune_forgets_dead_and_reused_processes(
    table: ProcessTable, child: subprocess.Popen[bytes]
) -> None:
    pid, start = me()
    child_start = start_time(child.pid)
    table.attach(pid, start)
    table.attach(child.pid, child_start)
    table._table[5] = (pid, start + 1)  # our pid, another process's start time
    assert _rows(table) == [(pid, start), (child.pid, child_start), (pid, start + 1)]
    assert table.live_pids() == sorted([pid, child.pid])
    table.prune()
    assert _rows(table) == [(pid, start), (child.pid, child_start)]
    _exit_and_become_zombie(child)
    assert table.live_pids() == [pid]  # dead processes are never reported...
    assert len(_rows(table)) == 2  # ...even before a prune
    table.prune()
    assert _rows(table) == [(pid, start)]


def test_attach_when_full_prunes_then_refuses(
    table: ProcessTable, child: subprocess.Popen[bytes]
) -> None:
    pid, start = me()
    size = len(table._table)
    assert size == 1024  # the default max_processes
    table.attach(child.pid, start_time(child.pid))
    table.attach(pid, start)
    table._table[2:] = (pid, start)  # the rest at once: attach by attach is O(n**2)
    with pytest.raises(PoolFullError, match="live processes"):
        table.attach(pid, start)
    _exit_and_become_zombie(child)
    table.attach(pid, start)  # the dead child's slot is reclaimed
    assert table.live_pids() == [pid]
    assert len(_rows(table)) == size
