"""procs: the attached-process table, judged alive by kernel-held leases.

Real pools, real child processes: a slot is live exactly while its holder's
lease is held, whatever happens to pids (reuse, other PID namespaces).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

import kvcache
from kvcache import PoolFullError, leases
from kvcache.config import PoolConfig
from kvcache.lifecycle import create_from_config
from kvcache.procs import me

_HOLD_OPEN = textwrap.dedent(
    """
    import sys, kvcache
    pool = kvcache.open(sys.argv[1])
    print(pool._engine.slot, pool._engine.serial, flush=True)
    sys.stdin.read()
    """
)


def _holder(name: str, *wrapper: str) -> tuple[subprocess.Popen[str], int, int]:
    """A child (optionally run under ``wrapper``) that opens pool ``name`` and waits."""
    proc = subprocess.Popen(
        [*wrapper, sys.executable, "-c", _HOLD_OPEN, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    slot, serial = map(int, line.split())
    return proc, slot, serial


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate(timeout=20)


def test_identity_of_this_process() -> None:
    who = me()
    assert who.pid == os.getpid()
    assert who.start > 0
    assert who.pid_ns == os.stat("/proc/self/ns/pid").st_ino
    assert me() is who  # cached until a fork


def test_a_pool_holds_a_slot_while_open(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("64K", page_size="1K")
    slot, serial = pool._engine.slot, pool._engine.serial
    assert serial >= 1
    assert pool._engine.procs.is_live(slot, serial)
    assert not pool._engine.procs.is_live(slot, serial + 1)  # a later holder of the slot
    assert not pool._engine.procs.is_live(-1, serial)
    assert not pool._engine.procs.is_live(10**6, serial)
    assert pool.stats().attached == (os.getpid(),)
    assert pool.stats().num_attached == 1
    with kvcache.open(pool.name) as other:  # a second handle takes a slot of its own
        assert other._engine.slot != slot
        assert pool._engine.procs.is_live(other._engine.slot, other._engine.serial)
        assert pool.stats().attached == (os.getpid(),)  # each process once
    assert not pool._engine.procs.is_live(other._engine.slot, other._engine.serial)


def test_a_killed_holder_is_dead_at_once_and_its_slot_serves_again(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    pool = make_pool("64K", page_size="1K")
    proc, slot, serial = _holder(pool.name)
    assert pool._engine.procs.is_live(slot, serial)
    assert proc.pid in pool.stats().attached
    _kill(proc)
    assert not pool._engine.procs.is_live(slot, serial)
    assert proc.pid not in pool.stats().attached
    # Its slot was not cleared (no clean close), so it is taken only once the
    # cleared ones are used up; a later holder gets a new serial.
    table = pool._engine.views.procs
    table["pid_ns"][table["pid_ns"] == 0] = 1  # white-box: every other slot looks used
    table["pid_ns"][slot] = 0
    with kvcache.open(pool.name) as again:
        assert (again._engine.slot, again._engine.serial) == (slot, serial + 1)
        assert not pool._engine.procs.is_live(slot, serial)  # the dead writer stays dead


def test_pid_reuse_cannot_revive_a_dead_holder(make_pool: Callable[..., kvcache.Pool]) -> None:
    """Regression: liveness was (pid, start time); a slot now carries no meaning in its pid."""
    pool = make_pool("64K", page_size="1K")
    proc, slot, serial = _holder(pool.name)
    _kill(proc)
    pool._engine.views.procs["pid"][slot] = os.getpid()  # as if our pid had been recycled
    pool._engine.views.procs["start"][slot] = me().start
    assert not pool._engine.procs.is_live(slot, serial)


def test_table_full_refuses_then_a_dead_slot_is_reused(pool_name: str) -> None:
    config = PoolConfig(size_bytes=64 << 10, page_size_bytes=1 << 10, max_processes=2)
    pool = create_from_config(pool_name, config)
    try:
        proc, slot, serial = _holder(pool_name)
        with pytest.raises(PoolFullError, match="2 live processes"):
            kvcache.open(pool_name)
        _kill(proc)
        with kvcache.open(pool_name) as reused:
            assert (reused._engine.slot, reused._engine.serial) == (slot, serial + 1)
    finally:
        pool.close()


def test_forked_child_takes_a_slot_of_its_own(make_pool: Callable[..., kvcache.Pool]) -> None:
    """Regression: a forked child shared its parent's attachment and was not listed."""
    pool = make_pool("1M", page_size="4K")
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its slot, store a value, wait, exit without closing
        try:
            os.close(read_end)
            os.write(write_end, f"{pool._engine.slot} {pool._engine.serial}\n".encode())
            pool.put("from-child", b"x" * 100_000)
            os.write(write_end, b"stored\n")
            os.read(go_read, 1)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as child_out:
        slot, serial = map(int, child_out.readline().split())
        assert child_out.readline() == "stored\n"
        assert slot != pool._engine.slot
        assert pool._engine.procs.is_live(slot, serial)
        assert pool._engine.procs.is_live(pool._engine.slot, pool._engine.serial)
        assert set(pool.stats().attached) == {os.getpid(), pid}
        os.write(go_write, b"x")
        os.waitpid(pid, 0)
    os.close(go_read)
    os.close(go_write)
    assert not pool._engine.procs.is_live(slot, serial)
    assert pool._engine.procs.is_live(
        pool._engine.slot, pool._engine.serial
    )  # the parent's lease is untouched
    assert pool.stats().attached == (os.getpid(),)
    assert pool.get("from-child") == b"x" * 100_000
    assert pool.check() == []


def test_holder_in_another_pid_namespace_is_alive(make_pool: Callable[..., kvcache.Pool]) -> None:
    """Regression: a live process in another PID namespace was judged dead by its pid."""
    pool = make_pool("64K", page_size="1K")
    proc, slot, serial = _holder(pool.name, "unshare", "--pid", "--fork", "--mount-proc")
    try:
        assert pool._engine.procs.is_live(slot, serial)
        stats = pool.stats()
        assert stats.num_attached == 2
        assert stats.attached == (os.getpid(),)  # its pid means nothing here
        assert int(pool._engine.views.procs["pid_ns"][slot]) != me().pid_ns
    finally:
        _kill(proc)
    assert not pool._engine.procs.is_live(slot, serial)
    assert pool.stats().num_attached == 1


def test_the_lease_is_gone_when_the_pool_lock_is_handed_over(tmp_path) -> None:
    """A holder's lease and flock share one description, and the kernel drops the
    lease first: whoever gets the lock after a death never sees the dead alive.

    (Regression of the pid-based check, under which a killed holder dropped its
    flock before it turned zombie and looked alive to the next holder.)
    """
    path = tmp_path / "lockfile"
    path.write_bytes(b"\0" * 8192)
    script = textwrap.dedent(
        """
        import fcntl, importlib.util, os, sys, time
        spec = importlib.util.spec_from_file_location("leases", sys.argv[2])
        leases = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(leases)  # alone: a child that starts fast, 40 times over
        fd = os.open(sys.argv[1], os.O_RDWR)
        assert leases.try_hold(fd, 4096)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(1, b"locked\\n")
        time.sleep(60)
        """
    )
    for _ in range(40):
        holder = subprocess.Popen(
            [sys.executable, "-S", "-c", script, str(path), leases.__file__],
            stdout=subprocess.PIPE,
        )
        fd = os.open(path, os.O_RDWR)
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"locked\n"
            assert leases.is_held(fd, 4096)
            holder.kill()
            fcntl.flock(fd, fcntl.LOCK_EX)  # handed over as the holder dies
            assert not leases.is_held(fd, 4096)
        finally:
            os.close(fd)
            holder.kill()
            holder.wait(timeout=20)
