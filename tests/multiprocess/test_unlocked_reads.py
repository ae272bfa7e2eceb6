"""Gets without the pool's lock (compiled engine, ``kvcache._lookup``'s ``read``), with real
processes: a writer churning the very entries and pages that readers copy, counts that
two readers tick at once, and the pure-Python users that turn such reads off.

Every value written is one byte repeated, which differs from one version to the next, so
a copy that mixes two writes (torn) shows in its bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from workers import Deadlock, deadline, start_script, wait_for_line

from kvcache import native
from kvcache.counters import SAMPLE_ENV
from kvcache.engine.store import KEPT_SAMPLES

X86_64 = os.uname().machine == "x86_64"
needs_unlocked = pytest.mark.skipif(
    native.Finder is None or not X86_64,
    reason="reads without the lock need kvcache._lookup on x86-64",
)
KEYS = 32
CHURN_S = 4.0

CHILD = r"""
import json, random, sys, time
import kvcache

command, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
verify = {"default": None, "off": False}[sys.argv[4]]
pool = kvcache.open(name, verify_reads=verify)
store = pool._engine

CHURNED = 1

def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

def value_of(version):
    return bytes([version % 251 + 1]) * size

def intact(value):
    return value == value[:1] * size

if command == "churn":  # overwrite the keys round and round until told to stop
    say("writing")
    import select
    version = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        version += 1
        key = version % CHURNED
        pool.put(f"k{key}", value_of(version))
    say(json.dumps({"puts": version}))
elif command == "read":  # get through the unlocked path, counting what it answered
    unlocked = store._read_unlocked
    answered = 0
    def counted(*args):
        global answered
        value = unlocked(*args)
        answered += value is not None
        return value
    store._read_unlocked = counted
    rng, hits, torn = random.Random(), 0, 0
    stop = time.monotonic() + float(sys.argv[5])
    while time.monotonic() < stop:
        key = rng.randrange(CHURNED)
        value = pool.get(f"k{key}")
        if value is not None:
            hits += 1
            torn += not intact(value)
    say(json.dumps({"hits": hits, "unlocked": answered, "torn": torn}))
elif command == "unchecked":  # the negative control: a copy no generation check guards,
    # by a reader preempted for a moment half way (as any reader may be)
    table, rng, copies, torn = store.table, random.Random(), 0, 0
    stop = time.monotonic() + float(sys.argv[5])
    while time.monotonic() < stop:
        key = rng.randrange(CHURNED)
        with store.lock:
            eid = table.find(f"k{key}".encode())
            if eid < 0:
                continue
            _, payload, _ = table.value_views(eid)
        first, *rest = payload.views
        value = bytes(first[: len(first) // 2])
        time.sleep(0.0002)
        value += bytes(first[len(first) // 2 :]) + b"".join(bytes(view) for view in rest)
        copies += 1
        torn += not intact(value)
    say(json.dumps({"copies": copies, "torn": torn}))
elif command == "count":  # get the same keys a number of times
    keys = [f"k{i}" for i in range(32)]
    say("ready")
    sys.stdin.readline()
    for _ in range(int(sys.argv[5])):
        for key in keys:
            assert pool.get(key) is not None
    say("done")
"""


def _child(name: str, command: str, size: int, verify: str, *args: object, pure: bool = False):
    """Run ``CHILD``'s ``command`` on pool ``name`` (values of ``size``, ``verify`` reads)."""
    return start_script(CHILD, command, name, size, verify, *args, pure=pure)


def _report(proc: subprocess.Popen, timeout: float = 120) -> dict[str, int]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def _stop(writer: subprocess.Popen) -> None:
    writer.stdin.write(b"stop\n")
    writer.stdin.flush()


def _churned(pool, size: int, verify: str, reader: str) -> dict[str, int]:
    """What ``reader`` reports after reading for ``CHURN_S`` beside a writer that overwrites
    one key of ``pool`` (room for two values) over and over: each put reuses the pages that
    the put before it freed."""
    writer = _child(pool.name, "churn", size, verify)
    try:
        wait_for_line(writer, "writing", timeout=60)
        report = _report(_child(pool.name, reader, size, verify, CHURN_S))
    finally:
        _stop(writer)
    assert _report(writer)["puts"] > 1000
    assert pool.check() == []
    return report


@needs_unlocked
@pytest.mark.parametrize(  # 1 MiB: copied without the GIL; prefix: its hit under the lock
    "policy, size",
    [("lru", 4096), ("lru", 65536), ("lru", 1 << 20), ("prefix", 4096), ("prefix", 1 << 20)],
)
def test_a_reader_without_the_lock_never_returns_a_torn_value(make_pool, policy, size) -> None:
    """Beside a writer reusing the entries and pages it reads, every value a compiled
    reader gets is whole, checked by the generation alone (values unverified). The same
    churn tears a copy that nothing checks; and with the generation check taken out of
    ``read`` this test fails (7-9 torn values at 4 KiB, 66-87 at 64 KiB, in 4 s). A
    ``prefix`` reader copies without the lock too, and waits for it for its hit alone."""
    pool = make_pool(f"{(size + 4096) * 2 // 1024}K", page_size="4K", policy=policy)
    report = _churned(pool, size, "off", "read")
    assert report["hits"] > 1000 and report["torn"] == 0, report
    assert report["unlocked"] > report["hits"] // 2, report  # mostly served without the lock
    control = _churned(pool, size, "off", "unchecked")
    assert control["torn"] > 0, control


@needs_unlocked
@pytest.mark.parametrize("policy", ["lru", "s3fifo", "prefix"])
def test_two_readers_without_the_lock_lose_no_hit_and_keep_the_clock_ahead(
    make_pool, policy
) -> None:
    """The hit count and the logical clock tick atomically: two readers' gets all count,
    and no entry's last access passes the clock (check() would report it). A queue
    policy's hits, each under the lock word taken in C, leave whole lists (check() again;
    with the word not taken for them, two readers moving entries at once break them)."""
    pool = make_pool("1M", page_size="4K", policy=policy)
    for key in range(KEYS):
        pool.put(f"k{key}", bytes(64))
    hits = pool.stats().hits
    rounds = 400
    readers = [_child(pool.name, "count", 64, "default", rounds) for _ in range(2)]
    for reader in readers:
        wait_for_line(reader, "ready", timeout=60)
    for reader in readers:
        reader.stdin.write(b"go\n")
        reader.stdin.flush()
    for key in range(KEYS):  # puts tick the clock under the lock meanwhile
        pool.put(f"k{key}", bytes(64))
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0 and out.decode().split()[-1] == "done", err.decode()
    assert pool.stats().hits == hits + 2 * rounds * KEYS
    assert pool.check() == []


@needs_unlocked
def test_a_pure_python_process_attached_turns_unlocked_reads_off(make_pool) -> None:
    """While a flock-only process is attached (its plain ticks could undo an atomic one)
    every get takes the lock; once it leaves, gets go without it again."""
    pool = make_pool("1M", page_size="4K", policy="lru")
    for key in range(KEYS):
        pool.put(f"k{key}", bytes(64))
    pure = _child(pool.name, "churn", 64, "default", pure=True)
    try:
        wait_for_line(pure, "writing", timeout=60)
        report = _report(_child(pool.name, "read", 64, "default", 0.5))
        assert report["hits"] > 100 and report["unlocked"] == 0, report
    finally:
        _stop(pure)
    _report(pure)
    report = _report(_child(pool.name, "read", 64, "default", 0.5))
    assert report["hits"] > 100 and report["unlocked"] == report["hits"], report


HOLD_LOCK = """
import sys, kvcache
pool = kvcache.open(sys.argv[1])
with pool._engine.lock:
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@contextlib.contextmanager
def held_by_another_process(pool) -> Iterator[None]:
    """Another process holds ``pool``'s lock for the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, pool.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(holder, "locked", timeout=60)
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


@needs_unlocked
@pytest.mark.parametrize("policy", ["lru", "prefix"])
def test_a_hit_is_read_while_another_process_holds_the_lock(make_pool, policy) -> None:
    """``in`` answers a hit while another process holds the pool's lock, whatever the policy
    (it touches nothing); so do a get and a get_into of a hit (``prefix`` moves its lists
    on a hit: it leaves that to the holder, ``Table.drain_deferred``). A miss waits for the
    lock."""
    pool = make_pool("1M", page_size="4K", policy=policy)
    pool.put("k", b"value")
    with held_by_another_process(pool):
        with deadline(30):
            assert "k" in pool
        gets = [lambda: pool.get("k") == b"value", lambda: pool.get_into("k", bytearray(5)) == 5]
        for get in gets:
            with deadline(30):
                assert get()
        for miss in (lambda: pool.get("absent"), lambda: "absent" in pool):
            with pytest.raises(Deadlock), deadline(0.5):
                miss()
    assert pool.get("absent") is None and "absent" not in pool
    assert pool.check() == []


@needs_unlocked
def test_a_timed_get_keeps_its_sample_back_while_another_process_holds_the_lock(
    make_pool, monkeypatch
) -> None:
    """A sampled get adds its latency to the shared histograms under the lock; while another
    process holds it, the get keeps the sample back (``KEPT_SAMPLES`` at most, later ones
    dropped) instead of waiting, and the next holder here adds them."""
    monkeypatch.setenv(SAMPLE_ENV, "1")  # every get timed
    pool = make_pool("1M", page_size="4K", policy="lru")
    pool.put("k", b"value")
    before = pool.metrics().latency["get"].count
    with held_by_another_process(pool), deadline(30):
        for _ in range(KEPT_SAMPLES + 10):
            assert pool.get("k") == b"value"
    assert pool.metrics().latency["get"].count == before + KEPT_SAMPLES
