"""Moves between the pools of a chain, from several processes, and processes killed mid-move.

A move copies first and removes second, never holding both pools' locks: a
process SIGKILLed in the middle leaves the entry in one pool or both (the same
bytes), its half-written copy is reclaimed like any dead writer's, and no value
read afterwards is torn or another key's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from workers import Children, audit, deadline, make_value, verify, wait_for_line

import kvcache

PAGE = 16 << 10
VALUE_BYTES = 40_000  # three pages, copied under the lock (at most 64 KiB)
BIG_VALUE_BYTES = 100_000  # over 64 KiB: the seqlock path


@pytest.fixture(params=["cpu", "disk"])
def chain(request, disk) -> Iterator[tuple[kvcache.Pool, kvcache.Pool]]:
    """A top pool of 512 KiB spilling to a bottom pool of 16 MiB (in shared memory, or a
    disk pool in a disk folder); destroyed afterwards."""
    top_name, bottom_name = (f"test-{uuid.uuid4().hex[:12]}" for _ in range(2))
    where = {"tier": "disk", "path": disk} if request.param == "disk" else {}
    bottom = kvcache.create(bottom_name, "16M", page_size=PAGE, **where)
    top = kvcache.create(top_name, "512K", page_size=PAGE, spill_to=bottom_name)
    yield top, bottom
    top.close()
    bottom.close()
    for name in (top_name, bottom_name):
        if name in kvcache.list_pools():
            kvcache.destroy(name, force=True)


def _keys_here(pool: kvcache.Pool) -> set:
    return {entry.key for entry in pool.entries()}


def _assert_consistent(top: kvcache.Pool, bottom: kvcache.Pool, expected: set) -> None:
    """Both pools repaired and sound, every value intact, every expected key in one or both.

    (``check`` recounts pages and slots against the entries: nothing leaked.)
    """
    for name in (top.name, bottom.name):  # an open reclaims dead writers' half-made entries
        kvcache.open(name).close()
    assert top.check() == [] and bottom.check() == []
    held = _keys_here(top) | _keys_here(bottom)
    _, problems = audit(top)  # reads every key of the chain (and promotes some)
    assert problems == []
    assert top.check() == [] and bottom.check() == []
    missing = expected - held
    assert not missing


def _fill(top: kvcache.Pool, count: int, size: int) -> set:
    rng = np.random.default_rng(7)
    for i in range(count):
        top.put(f"parent-{i}", make_value(f"parent-{i}", size, rng))
    return {f"parent-{i}" for i in range(count)}


def _kill_mid_move(top: kvcache.Pool, at: str, into: str, keys: list[str], size: int) -> None:
    """Run a child that moves an entry into pool ``into`` and pauses ``at`` a point; kill it."""
    with Children() as children:
        child = children.start(
            "pause-mid-move", pool=top.name, at=at, into=into, keys=keys, seed=1, value_bytes=size
        )
        wait_for_line(child, "paused", timeout=30)
        children.kill(child)


@pytest.mark.parametrize("size", [VALUE_BYTES, BIG_VALUE_BYTES])
@pytest.mark.parametrize("at", ["copy", "published"])
def test_killed_mid_demotion(chain, at: str, size: int) -> None:
    top, bottom = chain
    expected = _fill(top, 512 * 1024 // size, size)  # full: the child's first put spills
    _kill_mid_move(top, at, into=bottom.name, keys=[], size=size)
    with deadline(30):
        _assert_consistent(top, bottom, expected)
        if at == "published":  # the copy below is complete: the entry is in both now
            assert _keys_here(top) & _keys_here(bottom)


@pytest.mark.parametrize("at", ["copy", "published"])
def test_killed_mid_promotion(chain, at: str) -> None:
    top, bottom = chain
    expected = _fill(top, 60, VALUE_BYTES)  # most of them are below now
    below = sorted(_keys_here(bottom))
    assert below
    _kill_mid_move(top, at, into=top.name, keys=below, size=VALUE_BYTES)
    with deadline(30):
        _assert_consistent(top, bottom, expected)
        for key in below:  # and each reads back intact through the chain
            assert verify(key, top.get(key)) is None


def test_processes_spill_and_promote_under_churn_and_never_read_wrong_values(chain) -> None:
    top, bottom = chain
    with Children() as children:
        procs = [
            children.start(
                "hammer",
                pool=top.name,
                seed=seed,
                seconds=4,
                key_space=120,
                max_size=120_000,
                mix=(0.45, 0.9, 0.97, 0.995),
            )
            for seed in range(3)
        ]
        results = [children.result(proc, timeout=120) for proc in procs]
    assert all(result["failures"] == [] for result in results), results
    assert top.stats().spills > 0 and top.stats().promotions > 0
    with deadline(30):
        _assert_consistent(top, bottom, set())


def test_random_sigkills_while_spilling_and_promoting(chain) -> None:
    top, bottom = chain
    rng = np.random.default_rng()
    with Children() as children:
        for round_ in range(6):
            child = children.start(
                "churn", pool=top.name, seed=round_, key_space=100, max_size=120_000
            )
            wait_for_line(child, "ready", timeout=30)
            time.sleep(float(rng.uniform(0.05, 0.5)))
            children.kill(child)
            assert child.returncode != 3, child.stderr.read().decode()  # 3: it read a bad value
            with deadline(30):
                _assert_consistent(top, bottom, set())
