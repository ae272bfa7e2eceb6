"""The pool lock's word (compiled engine) beside flock (pure-Python engine), with real
processes: holders that die, PID namespaces, threads, fork, and both engines at once.

Every count here is a read-modify-write of a header word the format leaves unused
(``SPARE``) under ``pool._engine.lock``, with a yield between the read and the write:
without mutual exclusion increments are lost, and the totals show it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from workers import deadline, start_script, wait_for_line

import kvcache
from kvcache import fastpath, native
from kvcache.layout import HEADER_BYTES, HEADER_DTYPE, H

SPARE = HEADER_BYTES // 8 - 1
"""The header's last word: past ``HEADER_DTYPE``, so no part of kvcache reads or writes it."""
assert HEADER_DTYPE.itemsize <= SPARE * 8

NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
COMPILED = importlib.util.find_spec("kvcache._poollock") is not None

needs_compiled = pytest.mark.skipif(not COMPILED, reason="kvcache._poollock is not built")

CHILD = r"""
import json, os, sys, time
import kvcache
from kvcache.layout import H

command, name = sys.argv[1], sys.argv[2]
SPARE = int(sys.argv[3])
pool = kvcache.open(name)
lock, header = pool._engine.lock, pool._engine.views.header_q

def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

if command == "count":
    say("mode " + ("word" if lock._mine else "flock"))
    for _ in range(int(sys.argv[4])):
        with lock:
            value = header[SPARE]
            os.sched_yield()
            header[SPARE] = value + 1
    pool.close()
    say("done")
elif command == "hold":  # take the lock, skew a counter, and wait to be killed or told
    with lock:
        value = header[SPARE]
        header[H.used_pages] += int(sys.argv[4])
        say("locked")
        sys.stdin.readline()
        header[SPARE] = value + 1
    say("done")
elif command == "attach":  # be attached until stdin closes
    say("attached")
    sys.stdin.read()
"""


def _child(
    name: str, command: str, *args: object, pure: bool, wrapper: tuple[str, ...] = ()
) -> subprocess.Popen:
    """Run ``CHILD``'s ``command`` on pool ``name``, in the pure-Python engine if ``pure``."""
    return start_script(CHILD, command, name, SPARE, *args, pure=pure, wrapper=wrapper)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


def _namespaces_available() -> bool:
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _killed_holder_is_taken_over(pool: kvcache.Pool, wrapper: tuple[str, ...]) -> None:
    header = pool._engine.views.header_q
    repairs = pool.stats().repairs
    holder = _child(pool.name, "hold", 7, pure=False, wrapper=wrapper)
    try:
        wait_for_line(holder, "locked", timeout=60)
        assert header[H.lock_word] != 0  # held through the word (and the flock if counted)
        os.kill(_innermost(holder), signal.SIGKILL)
        holder.wait(timeout=30)
        with deadline(30):
            pool.put("after", b"the holder died")
            assert pool.get("after") == b"the holder died"
    finally:
        holder.kill()
        holder.communicate(timeout=30)
    assert pool.stats().repairs == repairs + 1  # dirty was set: the skew was repaired
    assert pool.check() == []


def _innermost(proc: subprocess.Popen) -> int:
    """The pid of the Python process: ``proc`` itself, or ``unshare --fork``'s only child."""
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(kids[0]) if kids else proc.pid


@needs_compiled
def test_a_compiled_holder_killed_while_holding_is_taken_over(make_pool) -> None:
    _killed_holder_is_taken_over(make_pool("1M", page_size="16K"), wrapper=())


@needs_compiled
@pytest.mark.skipif(
    not _namespaces_available(), reason="needs unshare --pid (root or user namespaces)"
)
def test_a_holder_killed_in_another_pid_namespace_is_taken_over(make_pool) -> None:
    _killed_holder_is_taken_over(make_pool("1M", page_size="16K"), wrapper=NAMESPACE)


def test_threads_lose_no_increment(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    lock, header = pool._engine.lock, pool._engine.views.header_q

    def count() -> None:
        for _ in range(2000):
            with lock:
                value = header[SPARE]
                time.sleep(0)  # hand the GIL over mid-increment
                header[SPARE] = value + 1

    threads = [threading.Thread(target=count) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert header[SPARE] == 8000


@pytest.mark.skipif(
    native.Finder is None or native.poollock is None, reason="the compiled put and lock word"
)
def test_a_put_taking_the_word_in_c_waits_for_a_thread_holding_the_lock(make_pool) -> None:
    """A small put takes the lock word in C without the thread lock (the GIL keeps this
    process's threads out for the call): while another thread holds the lock, across a
    hand-over of the GIL, no put lands; the put waits for the lock instead."""
    pool = make_pool("1M", page_size="16K", policy="lru")
    engine = pool._engine
    lock, header = engine.lock, engine.views.header_q
    pool.put("first", b"")  # reserves the pool's memory
    put, answers, landed_while_held = engine._put, [], []
    engine._put = lambda *args: answers.append(put(*args)) or answers[-1]
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            with lock:
                puts = header[H.puts]
                time.sleep(0)  # hand the GIL over while holding the lock
                landed_while_held.append(header[H.puts] != puts)

    thread = threading.Thread(target=hold)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often, mid-put included
    thread.start()
    try:
        # puts until the thread held the lock often, however the machine shares its time
        for i in range(300_000):
            pool.put(f"key{i % 50}", bytes([i % 251]) * 100)
            if i >= 3000 and len(landed_while_held) > 200:
                break
    finally:
        stop.set()
        thread.join(timeout=60)
        sys.setswitchinterval(interval)
    assert len(landed_while_held) > 100 and not any(landed_while_held)
    taken_in_c = [a for a in answers if a not in (None, fastpath.LOCK_BUSY)]
    assert fastpath.LOCK_BUSY in answers and len(taken_in_c) > 100  # both ways were taken
    last = {key: i - (i - key) % 50 for key in range(50)}  # each key's last put
    assert all(pool.get(f"key{key}") == bytes([last[key] % 251]) * 100 for key in range(50))
    assert pool.check() == []


def test_a_forked_child_and_its_parent_exclude_each_other(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    lock, header = pool._engine.lock, pool._engine.views.header_q
    parent_word = lock._mine
    with lock:  # the child starts while the parent holds it: it must wait for it
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                assert lock._mine != parent_word or parent_word == 0
                for _ in range(3000):
                    with lock:
                        value = header[SPARE]
                        os.sched_yield()
                        header[SPARE] = value + 1
                code = 0
            finally:
                os._exit(code)
        time.sleep(0.2)
        assert header[SPARE] == 0  # the child is still waiting
    for _ in range(3000):
        with lock:
            value = header[SPARE]
            os.sched_yield()
            header[SPARE] = value + 1
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert header[SPARE] == 6000


@needs_compiled
def test_compiled_and_pure_python_processes_at_once_lose_no_increment(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    header = pool._engine.views.header_q
    children = [_child(pool.name, "count", 3000, pure=pure) for pure in (False, True, False, True)]
    try:
        outputs = [_finish(child) for child in children]
    finally:
        for child in children:
            child.kill()
    modes = [out.splitlines()[0] for out in outputs]
    assert modes == ["mode word", "mode flock", "mode word", "mode flock"]
    assert header[SPARE] == 12000
    # each pure process took its count back (this one counts too in a pure-Python run)
    assert header[H.flock_users] == (0 if native.poollock else 1)


@needs_compiled
@pytest.mark.skipif(native.poollock is None, reason="this process is a flock user itself")
def test_a_pure_process_attaching_waits_for_a_word_holder(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    header = pool._engine.views.header_q
    holder = _child(pool.name, "hold", 0, pure=False)
    joiner = None
    try:
        wait_for_line(holder, "locked", timeout=60)
        assert header[H.lock_word] != 0 and header[H.flock_users] == 0
        joiner = _child(pool.name, "count", 1, pure=True)
        limit = time.monotonic() + 60
        while header[H.flock_users] == 0 and time.monotonic() < limit:
            time.sleep(0.01)  # it opens the pool and counts itself, then waits holding nothing
        assert header[H.flock_users] == 1
        time.sleep(0.5)
        assert joiner.poll() is None  # it waits for the holder, which missed its count
        assert header[SPARE] == 0
        holder.stdin.write(b"go\n")  # the holder writes its increment and lets go
        holder.stdin.flush()
        _finish(holder)
        _finish(joiner)
    finally:
        for proc in (holder, joiner):
            if proc is not None:
                proc.kill()
    assert header[SPARE] == 2


@needs_compiled
@pytest.mark.skipif(native.poollock is None, reason="this process locks with flock only")
def test_a_dead_pure_process_count_is_taken_back(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    header = pool._engine.views.header_q
    pure = _child(pool.name, "attach", pure=True)
    try:
        wait_for_line(pure, "attached", timeout=60)
        assert header[H.flock_users] == 1
        pure.kill()
        pure.wait(timeout=30)
    finally:
        pure.kill()
        pure.communicate(timeout=30)
    assert header[H.flock_users] == 1  # dead: it never took it back
    time.sleep(1.1)  # the check runs at most once a second
    with deadline(30):
        pool.get("k")
    assert header[H.flock_users] == 0


@pytest.mark.skipif(native.poollock is None, reason="this process locks with flock only")
@pytest.mark.parametrize(
    "garbage",
    [
        (7 << 32) | ((1 << 21) - 1),  # a slot past the process table
        1 << 31,  # a waiter's mark and no owner
        (99 << 32) | 1,  # slot 0 with a serial its holder never had
        -1,
    ],
)
def test_a_garbage_lock_word_is_taken_over_not_waited_for(make_pool, garbage: int) -> None:
    pool = make_pool("1M", page_size="16K")
    header = pool._engine.views.header_q
    repairs = pool.stats().repairs
    header[H.lock_word] = garbage  # damage: names no live holder
    header[H.dirty] = 1  # as a holder that died leaves it
    with deadline(30):
        pool.put("k", b"after the damage")
        assert pool.get("k") == b"after the damage"
    assert header[H.lock_word] == 0
    assert pool.stats().repairs == repairs + 1
    header[H.flock_users] = -5  # damage: any non-zero count makes holders take the flock
    time.sleep(1.1)  # the count is checked at most once a second
    with deadline(30):
        pool.get("k")
    assert header[H.flock_users] == 0  # no flock user lives: taken back
