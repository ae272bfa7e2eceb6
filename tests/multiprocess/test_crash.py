"""Processes SIGKILLed at any point never deadlock, corrupt or leak a pool for good.

A death while holding the lock leaves the header's ``dirty`` word set, and the
next lock holder repairs; a death in the middle of a large value's copy
(outside the lock) leaves a WRITING entry whose owner is dead, which the next
``open`` (or an eviction that runs out of victims) reclaims. Every pool call
the parent makes after a kill runs under ``deadline`` so that a lock left held
fails the test instead of hanging it.
"""

from __future__ import annotations

import re
import signal
import threading
import time

import numpy as np
import pytest
from workers import Children, audit, deadline, make_value, verify, wait_for_line

import kvcache
from kvcache.layout import H

ROUNDS = 10
CHILDREN_PER_ROUND = 2

_DEAD_WRITER = re.compile(r"^entry \d+: half-written by process (\d+), which died$")
_LEAK_SYMPTOMS = re.compile(
    r"^(used pages counter is|free list has|free pages counter is|free entry chain does not match) "
)


def _unexplained(problems: list[str], dead: set[int]) -> list[str]:
    """Problems other than dead writers' WRITING entries and the pages and slots they hold.

    The leak symptoms (counters, free list, free entry chain) are excused only
    when a dead writer is reported too.
    """
    writers = [m for m in map(_DEAD_WRITER.match, problems) if m]
    if any(int(m.group(1)) not in dead for m in writers):
        return problems  # a writer that was never killed was declared dead
    return [
        p for p in problems if not (_DEAD_WRITER.match(p) or (writers and _LEAK_SYMPTOMS.match(p)))
    ]


def _assert_sound(pool: kvcache.Pool) -> None:
    assert pool.check() == []
    live_bytes, problems = audit(pool)
    assert problems == []
    assert pool.stats().used_bytes == live_bytes


@pytest.mark.parametrize("inline_bytes", [0, 1024])
def test_random_sigkills_during_churn(make_pool, inline_bytes: int) -> None:
    """With inline slots, about a sixth of the values (a kilobyte or less) lie in them."""
    pool = make_pool("4M", page_size="16K", policy="lru", inline_bytes=inline_bytes)
    rng = np.random.default_rng()
    name = pool.name
    seen = {"repaired": 0, "dead writers": 0}  # how the kills landed, for -s runs
    repairs_before = 0
    with Children() as children:
        for round_ in range(ROUNDS):
            procs = [
                children.start(
                    "churn", pool=name, seed=round_ * 100 + i, key_space=60, max_size=300_000
                )
                for i in range(CHILDREN_PER_ROUND)
            ]
            for proc in procs:
                wait_for_line(proc, "ready", timeout=20)
            for proc in procs:  # staggered, so kills land at unrelated points of each loop
                time.sleep(float(rng.uniform(0.02, 0.35)))
                children.kill(proc)
            for proc in procs:
                assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-3000:]
            dead = {proc.pid for proc in procs}

            with deadline(30):
                # Taking the lock repairs a pool left dirty; what check() may still
                # see is only a dead writer's half-written entry and its pages.
                problems = pool.check()
                assert _unexplained(problems, dead) == []
                seen["repaired"] += pool.stats().repairs > repairs_before
                seen["dead writers"] += any("half-written" in p for p in problems)
                with kvcache.open(name) as fresh:  # a new attachment reclaims dead writers
                    _assert_sound(fresh)
                    assert dead.isdisjoint(fresh.stats().attached)
                # the handle opened before all the crashes still works
                key = f"parent-{round_}"
                pool.put(key, make_value(key, 200_000, rng))
                assert verify(key, pool.get(key)) is None
                _assert_sound(pool)
                repairs_before = pool.stats().repairs
    print(f"{ROUNDS} rounds of kills: {seen}")


def test_killed_while_holding_the_lock(make_pool) -> None:
    pool = make_pool("1M", page_size="16K")
    rng = np.random.default_rng(7)
    for i in range(10):
        pool.put(f"k{i}", make_value(f"k{i}", 3000 * (i + 1), rng))
    before = pool.stats()
    with Children() as children:
        # White-box setup: the child enters pool._engine.lock, skews used_pages as if
        # it died half-way through an allocation, and sleeps until killed.
        holder = children.start("hold-lock", pool=pool.name, skew_used_pages=5)
        wait_for_line(holder, "locked", timeout=20)
        assert pool._engine.views.header_q[H.dirty] == 1  # white-box: the holder's mark

        seen: dict[str, kvcache.PoolStats] = {}
        waiter = threading.Thread(target=lambda: seen.update(stats=pool.stats()), daemon=True)
        waiter.start()
        waiter.join(timeout=0.3)
        assert waiter.is_alive(), "stats() did not wait for the lock another process holds"

        children.kill(holder)
        waiter.join(timeout=20)
        assert not waiter.is_alive(), "the lock was not handed over when its holder died"
    after = seen["stats"]
    assert after.repairs == before.repairs + 1
    assert after.used_bytes == before.used_bytes  # the skew was repaired away
    assert after.num_entries == 10
    assert holder.pid not in after.attached
    with deadline(20):
        assert pool._engine.views.header_q[H.dirty] == 0
        _assert_sound(pool)
        pool.put("after", b"fine")
        assert pool.get("after") == b"fine"
        assert pool.stats().repairs == after.repairs  # repaired once, not on every lock


def test_killed_while_holding_the_lock_without_mutating(make_pool) -> None:
    """A reader that dies under the lock also leaves ``dirty``: one repair, no loss."""
    pool = make_pool("1M", page_size="16K")
    kept = make_value("kept", 5000, np.random.default_rng(5))
    pool.put("kept", kept)
    before = pool.stats()
    with Children() as children:
        holder = children.start("hold-lock", pool=pool.name)
        wait_for_line(holder, "locked", timeout=20)
        children.kill(holder)
    with deadline(20):
        assert pool.get("kept") == kept
        assert pool.stats().repairs == before.repairs + 1
        _assert_sound(pool)


VALUE_PAGES = 25  # 400 KB with 16 KiB pages


@pytest.mark.parametrize("reclaim", ["open", "sweep", "eviction", "check-repair"])
def test_writer_killed_mid_copy_is_reclaimed(make_pool, reclaim: str) -> None:
    pool = make_pool("1M", page_size="16K", policy="lru")  # 64 pages
    page = pool.stats().page_size_bytes
    rng = np.random.default_rng(3)
    old = make_value("victim", 100_000, rng)  # the key the dead writer was replacing
    pool.put("victim", old)
    for i in range(5):
        pool.put(f"other{i}", make_value(f"other{i}", 20_000, rng))
    before = pool.stats()

    with Children() as children:
        writer = children.start(
            "die-mid-write", pool=pool.name, key="victim", size=VALUE_PAGES * page - 200, seed=4
        )
        writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL, writer.stderr.read().decode()[-3000:]

    with deadline(20):
        leaked = pool.stats()
        assert leaked.repairs == before.repairs  # died outside the lock: nothing to repair
        assert leaked.used_bytes == before.used_bytes + VALUE_PAGES * page
        problems = pool.check()
        assert f"half-written by process {writer.pid}, which died" in " ".join(problems)
        assert _unexplained(problems, {writer.pid}) == []
        assert pool.get("victim") == old  # the half-written replacement is never served

        if reclaim == "open":
            with kvcache.open(pool.name):
                pass
        elif reclaim == "sweep":
            # one page more than is free: the sweep that runs before eviction
            # reclaims the dead writer's pages, so nothing needs evicting
            free_pages = pool.stats().free_bytes // page
            pool.put("filler", make_value("filler", (free_pages + 1) * page - 200, rng))
            assert pool.stats().evictions == before.evictions
            assert pool.get("victim") == old
        elif reclaim == "eviction":
            # needs more pages than evicting every live entry frees: only the
            # dead writer's pages can make up the difference
            big_pages = 64 - VALUE_PAGES + 10
            pool.put("big", make_value("big", big_pages * page - 200, rng))
            assert verify("big", pool.get("big")) is None
        else:
            assert pool.check(repair=True) != []

        _assert_sound(pool)
        if reclaim in ("open", "check-repair"):
            assert pool.stats().used_bytes == before.used_bytes
            assert pool.get("victim") == old


def test_writer_killed_under_the_lock_is_dropped_by_the_repair(make_pool) -> None:
    """A process killed under the lock with a WRITING entry of its own: the repair
    that the next (already waiting) holder runs must drop that entry at once.

    With pid-based liveness the dying holder often still looked alive to that
    repair, which then kept its entry; with leases it cannot (see
    ``test_procs.test_the_lease_is_gone_when_the_pool_lock_is_handed_over``).
    """
    pool = make_pool("2M", page_size="16K")  # 128 pages
    rng = np.random.default_rng(9)
    pool.put("kept", make_value("kept", 50_000, rng))
    with Children() as children:
        for i in range(3):
            before = pool.stats()
            holder = children.start(
                "reserve-and-hold-lock", pool=pool.name, key=f"w{i}", size=200_000, seed=i
            )
            wait_for_line(holder, "locked", timeout=20)
            waiter = threading.Thread(target=pool.stats, daemon=True)  # blocks on the lock
            waiter.start()
            waiter.join(timeout=0.2)
            assert waiter.is_alive()
            children.kill(holder)
            waiter.join(timeout=20)
            assert not waiter.is_alive()
            with deadline(20):
                assert pool.stats().repairs == before.repairs + 1
                _assert_sound(pool)  # no reopen needed: the repair dropped the dead writer
                assert pool.stats().used_bytes == before.used_bytes
                assert pool.get(f"w{i}") is None
