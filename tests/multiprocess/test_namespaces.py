"""Processes in other PID namespaces (containers of one pod) share pools safely.

Children run under ``unshare --pid --fork --mount-proc``: they share /dev/shm
with the test but see other pids (the child is pid 1 of its namespace). The
regression: a host process judged a live writer in a namespace dead by its pid,
reclaimed its half-written pages and gave them to another entry; the host's key
vanished, a truncated key appeared and ``health`` said the pool was consistent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from workers import Children, audit, deadline, make_value, verify, wait_for_line

import kvcache

NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")


def _namespaces_available() -> bool:
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_available(),
    reason="needs unshare --pid (root or user namespaces); CI runs as root",
)


def _inner_pid(wrapper: subprocess.Popen) -> int:
    """The host pid of the process ``unshare --fork`` runs (its only child)."""
    children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _kill_inner(children: Children, wrapper: subprocess.Popen) -> None:
    """SIGKILL the process inside the namespace (as the OOM killer would), then reap all."""
    os.kill(_inner_pid(wrapper), signal.SIGKILL)
    wrapper.wait(timeout=20)  # unshare exits once its child is dead
    children.kill(wrapper)


def _assert_killed_inside(wrapper: subprocess.Popen) -> None:
    """The churner in ``wrapper``'s namespace was killed, not stopped by a bad read.

    unshare exits with its child's status (3 for a failed verification); for a
    child killed by a signal it re-raises it, or (util-linux 2.38) fails to and exits 1.
    """
    assert wrapper.returncode != 3
    assert b"VERIFICATION FAILURE" not in wrapper.stderr.read()


def _assert_sound(pool: kvcache.Pool) -> None:
    assert pool.check() == []
    live_bytes, problems = audit(pool)
    assert problems == []
    assert pool.stats().used_bytes == live_bytes


def test_a_live_writer_in_another_namespace_is_never_reclaimed(make_pool) -> None:
    pool = make_pool("2M", page_size="16K")  # 128 pages
    rng = np.random.default_rng(1)
    with Children() as children:
        writer = children.start(
            "pause-mid-write", wrapper=NAMESPACE, pool=pool.name, key="ns", size=600_000, seed=2
        )
        wait_for_line(writer, "copying", timeout=30)
        # Everything that reclaims dead writers' pages runs while it copies:
        with deadline(30):
            with kvcache.open(pool.name) as fresh:
                assert fresh.check(repair=True) == []
            for i in range(40):  # fill the pool over and over: eviction looks for room
                pool.put(f"host{i}", make_value(f"host{i}", 150_000, rng))
            assert pool.stats().num_attached == 2
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        result = children.result(writer)
    assert result["problem"] is None
    assert verify("ns", pool.get("ns")) is None
    _assert_sound(pool)


def test_churn_with_kills_inside_and_outside_namespaces(make_pool) -> None:
    """Writers and readers in namespaces and on the host, some SIGKILLed at random
    points: no child ever reads a wrong value (each exits 3 at once if it does),
    nothing live is reclaimed (a live writer whose pages were taken fails its put),
    and everything the dead left behind is reclaimed."""
    pool = make_pool("4M", page_size="16K")
    rng = np.random.default_rng()
    params = {"pool": pool.name, "key_space": 50, "max_size": 300_000}
    with Children() as children:
        survivors = [
            children.start("churn", wrapper=NAMESPACE, seed=1, **params),
            children.start("churn", seed=2, **params),
        ]
        for proc in survivors:
            wait_for_line(proc, "ready", timeout=30)
        for round_ in range(6):
            inside = children.start("churn", wrapper=NAMESPACE, seed=10 + round_, **params)
            outside = children.start("churn", seed=20 + round_, **params)
            for proc in (inside, outside):
                wait_for_line(proc, "ready", timeout=30)
            time.sleep(float(rng.uniform(0.05, 0.4)))
            _kill_inner(children, inside)
            children.kill(outside)
            # killed, not dead of a failed verification (exit 3)
            assert outside.returncode == -signal.SIGKILL
            _assert_killed_inside(inside)
            with deadline(30):
                with kvcache.open(pool.name) as fresh:  # reclaims what the dead left
                    # (the survivors keep churning: exact byte audits wait for the end)
                    assert fresh.check() == []
                    assert fresh.stats().num_attached == 3  # this process and the two survivors
                key = f"parent-{round_}"
                pool.put(key, make_value(key, 200_000, rng))
                assert verify(key, pool.get(key)) is None
            for proc in survivors:
                assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        for proc in survivors:
            proc.kill()
        for proc in survivors:
            proc.wait(timeout=20)
        _assert_killed_inside(survivors[0])
    with deadline(30), kvcache.open(pool.name) as fresh:
        _assert_sound(fresh)
