"""Pools are shared by name between real, separate processes: values, counters, attachments."""

from __future__ import annotations

import fcntl
import json
import os
import select
import time

import numpy as np
import pytest
from workers import Children, audit, hammer, make_value, sample_values, verify, wait_for_line

import kvcache
from kvcache.layout import H


def test_value_written_by_exited_process_is_read_by_a_later_one(pool_name: str) -> None:
    with Children() as children:
        writer = children.start("write-values", pool=pool_name, size="4M", page_size="16K")
        written = children.result(writer)
        assert writer.returncode == 0  # the writer is gone; its pool must not be
        assert pool_name in kvcache.list_pools()
        assert written["stats"]["num_entries"] == len(sample_values())

        reader = children.start("read-values", pool=pool_name)
        same = children.result(reader)["same"]
    assert same == dict.fromkeys(sample_values(), True)

    with kvcache.open(pool_name) as pool:  # and this process reads the very same
        for key, expected in sample_values().items():
            got = pool[key]
            if isinstance(expected, np.ndarray):
                assert isinstance(got, np.ndarray)
                assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
                np.testing.assert_array_equal(got, expected)
            else:
                assert type(got) is bytes
                assert got == expected
        assert pool.check() == []


def test_counters_are_shared_both_ways(make_pool) -> None:
    pool = make_pool("4M", page_size="16K")
    pool.put("parent", b"p")
    assert pool.get("parent") == b"p"
    assert pool.get("nope") is None
    before = pool.stats()
    with Children() as children:
        child = children.start("count", pool=pool.name, puts=7, hits=11, misses=5)
        seen = children.result(child)["seen"]
    # the child saw the parent's counts ...
    assert (seen["puts"], seen["hits"], seen["misses"]) == (before.puts, before.hits, before.misses)
    assert seen["num_entries"] == 1
    # ... and the parent sees exactly the child's
    after = pool.stats()
    assert after.puts - before.puts == 7
    assert after.hits - before.hits == 11
    assert after.misses - before.misses == 5
    assert after.num_entries == 8
    assert pool.get("child-6") == b"v" * 100
    assert pool.check() == []


def test_attached_lists_live_children_only(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    me = pool.stats().attached
    with Children() as children:
        closer = children.start("attach-and-wait", pool=pool.name, close=True)
        killed = children.start("attach-and-wait", pool=pool.name, close=False)
        wait_for_line(closer, "ready", timeout=20)
        wait_for_line(killed, "ready", timeout=20)
        attached = pool.stats().attached
        assert closer.pid in attached
        assert killed.pid in attached
        assert set(me) <= set(attached)

        children.result(closer)  # stdin closes: it detaches and exits normally
        children.kill(killed)  # never detaches: must be recognised as dead
        attached = pool.stats().attached
        assert closer.pid not in attached
        assert killed.pid not in attached
        assert set(attached) == set(me)

        # White-box: a clean close clears its slot; a killed process's slot keeps its
        # pid for display until reused, but its lease is gone, so it is not listed.
        procs = pool._engine.views.procs
        assert closer.pid not in procs["pid"]
        assert killed.pid in procs["pid"]


def test_regression_zero_dim_array_came_back_as_1d(make_pool) -> None:
    """Bug: codec used np.ascontiguousarray, which turns a 0-d array into shape (1,)."""
    pool = make_pool("1M", page_size="16K")
    pool.put("scalar", np.array(3.25))
    got = pool.get("scalar")
    assert isinstance(got, np.ndarray)
    assert got.shape == ()
    assert got.dtype == np.float64
    assert got.item() == 3.25
    pool.put("0d-view", np.arange(10, dtype=np.int16)[3, ...])  # a 0-d view into a bigger array
    got = pool.get("0d-view")
    assert (got.shape, got.dtype, got.item()) == ((), np.int16, 3)


def _wait_child(pid: int, timeout: float) -> int:
    """Reap forked child ``pid`` within ``timeout`` (SIGKILL it after); its exit status."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"forked child {pid} did not finish in {timeout}s")


def _read_all(fd: int, timeout: float) -> bytes:
    chunks, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], end - time.monotonic())
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_pool_opened_before_fork_is_shared_concurrently(make_pool) -> None:
    pool = make_pool("4M", page_size="16K", policy="fifo")
    rng = np.random.default_rng(11)
    before_fork = make_value("before-fork", 150_000, rng)
    pool.put("before-fork", before_fork)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: use the inherited Pool object, then leave without pytest's cleanup
        code = 1
        try:
            os.close(read_end)
            report = {"inherited": verify("before-fork", pool.get("before-fork"))}
            report.update(hammer(pool, seed=21, seconds=1.5, key_space=40, max_size=200_000))
            pool.put("from-child", make_value("from-child", 90_000, np.random.default_rng(1)))
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        mine = hammer(pool, seed=22, seconds=1.5, key_space=40, max_size=200_000)
        child = json.loads(_read_all(read_end, timeout=30) or b"{}")
    finally:
        os.close(read_end)
        status = _wait_child(pid, timeout=30)
    assert status == 0
    assert child["inherited"] is None
    assert child["failures"] == [] and mine["failures"] == []
    assert child["verified"] > 0 and mine["verified"] > 0
    assert verify("from-child", pool.get("from-child")) is None
    assert pool.check() == []
    live_bytes, problems = audit(pool)
    assert problems == []
    assert pool.stats().used_bytes == live_bytes


def _probe_lock(pool: kvcache.Pool) -> bytes:
    """In the forked child: whether its lock is the parent's (``acquired``) or excluded."""
    lock = pool._engine.lock
    if lock._mine:  # the lock word: the parent's slot holds it, so it must not name us
        held_by = pool._engine.views.header_q[H.lock_word] & ((1 << 64) - 1) & ~(1 << 31)
        return b"acquired " if held_by == lock._mine else b"blocked "
    try:
        fcntl.flock(lock.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return b"blocked "
    fcntl.flock(lock.fd, fcntl.LOCK_UN)
    return b"acquired "


@pytest.mark.parametrize("name_now", ["kept", "removed", "recreated"])
def test_forked_child_gets_a_lock_of_its_own(make_pool, name_now: str) -> None:
    """White-box: with the parent inside ``pool._engine.lock``, the child must not hold it:
    its flock must not succeed, and its lock word identity must not be the parent's.

    Without ``Pool._after_fork`` the child would share the parent's open file
    description, and so its flock: both would "hold" the lock at once. Regression:
    the child's description was reopened by path, which fails once the file is
    removed (the child then kept the parent's), or, once a pool was created again
    under the name, locks that other pool. The file is removed as ``rm`` would
    (``kvcache.destroy`` now also stops the old handles, see test_segment).
    """
    pool = make_pool("1M", page_size="16K")
    if name_now != "kept":
        kvcache.segment.segment_path(pool.name).unlink()
    if name_now == "recreated":
        kvcache.create(pool.name, "1M", page_size="16K").close()
    read_end, write_end = os.pipe()
    with pool._engine.lock:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.write(write_end, _probe_lock(pool))
                pool.put("child", b"waited")  # blocks until the parent lets go
                os.write(write_end, b"stored")
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            verdict = os.read(read_end, 9)  # the probe's answer; the put is still waiting
        except BaseException:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise
    try:
        rest = _read_all(read_end, timeout=30)
    finally:
        os.close(read_end)
        status = _wait_child(pid, timeout=30)
    assert verdict == b"blocked "
    assert rest == b"stored"
    assert status == 0
    assert pool.get("child") == b"waited"
    assert pool.check() == []
