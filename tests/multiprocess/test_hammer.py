"""Concurrent put/get/delete/evict under heavy eviction churn: no reader ever sees torn data.

Every value verifies itself (see ``workers.verify``); values range from a few
bytes to several pages and beyond ``INLINE_COPY_MAX_BYTES``, so both the
copy-under-the-lock path and the out-of-lock copy + seqlock path are raced.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from workers import INLINE_COPY_MAX_BYTES, Children, audit, hammer

import kvcache

SECONDS = 3.0
WORKERS = 4

READ_HEAVY = (0.30, 0.65, 0.80, 0.995)
"""Cumulative shares of put, get, get_into, delete (the rest: evict). With a key
space a few times the pool, most reads hit values whose pages are being
recycled by replacement puts, deletes and evictions: with the seqlock recheck
in ``Pool.get`` removed, this workload reports torn reads within seconds."""

POOLS = {
    # pages run out long before entry slots; large values span up to 19 pages
    "8M-16K-fifo": dict(size="8M", page_size="16K", policy="fifo", key_space=80, max_size=300_000),
    # few entry slots and tiny pages: churn by slots too, values up to 25 (scattered) pages
    "2M-4K-lfu-64slots": dict(
        size="2M", page_size="4K", policy="lfu", max_entries=64, key_space=60, max_size=100_000
    ),
    # values of a kilobyte or less in inline slots, the rest in pages: both churn
    "4M-16K-lru-inline": dict(
        size="4M", page_size="16K", policy="lru", inline_bytes=1024, key_space=80, max_size=300_000
    ),
    # queue policies: hits move lists (under the lock word, or deferred to its holder)
    "4M-16K-prefix": dict(
        size="4M", page_size="16K", policy="prefix", key_space=80, max_size=300_000
    ),
    "4M-16K-s3fifo-inline": dict(
        size="4M",
        page_size="16K",
        policy="s3fifo",
        inline_bytes=1024,
        key_space=80,
        max_size=300_000,
    ),
}


def _assert_consistent(pool: kvcache.Pool, results: list[dict]) -> None:
    failures = [f for r in results for f in r["failures"]]
    assert failures == []
    assert sum(r["verified"] for r in results) > 0
    assert sum(r["large_hits"] for r in results) > 0, "no read took the out-of-lock path"
    assert sum(r["large_puts"] for r in results) > 0
    stats = pool.stats()
    assert stats.evictions > 0, "the workload never forced an eviction"
    assert pool.check() == []
    live_bytes, problems = audit(pool)
    assert problems == []
    assert stats.used_bytes == live_bytes


def _start_hammer(children: Children, pool: Any, seed: int, key_space: int, max_size: int) -> Any:
    """One worker of read-heavy, self-verifying operations on ``pool`` for SECONDS."""
    return children.start(
        "hammer",
        pool=pool.name,
        seed=seed,
        seconds=SECONDS,
        key_space=key_space,
        max_size=max_size,
        mix=READ_HEAVY,
    )


@pytest.mark.parametrize("shape", POOLS)
def test_processes_hammer_one_small_pool(make_pool, shape: str) -> None:
    params = dict(POOLS[shape])
    key_space, max_size = params.pop("key_space"), params.pop("max_size")
    assert max_size > INLINE_COPY_MAX_BYTES
    pool = make_pool(**params)
    with Children() as children:
        procs = [
            _start_hammer(children, pool, seed, key_space, max_size) for seed in range(WORKERS)
        ]
        results = [children.result(proc, timeout=SECONDS + 30) for proc in procs]
    _assert_consistent(pool, results)
    assert set(pool.stats().attached).isdisjoint(p.pid for p in procs)  # they closed and left
    if params["policy"] in ("prefix", "s3fifo") and pool._engine._read_unlocked is not None:
        deferred = pool._engine.views.header["deferred_next"]
        assert deferred > 0, "no get left its queue hit to the lock's holder"


@pytest.mark.parametrize("shape", ["8M-16K-fifo", "4M-16K-lru-inline"])
def test_compiled_and_pure_python_processes_hammer_one_pool(make_pool, monkeypatch, shape) -> None:
    """Both engines at once: the lock word and flock exclude each other (see kvcache.lock)."""
    params = dict(POOLS[shape])
    key_space, max_size = params.pop("key_space"), params.pop("max_size")
    pool = make_pool(**params)
    with Children() as children:
        procs = []
        for seed in range(WORKERS):
            if seed % 2:
                monkeypatch.setenv("KVCACHE_PURE_PYTHON", "1")
            else:
                monkeypatch.delenv("KVCACHE_PURE_PYTHON", raising=False)
            procs.append(_start_hammer(children, pool, seed, key_space, max_size))
        results = [children.result(proc, timeout=SECONDS + 30) for proc in procs]
    _assert_consistent(pool, results)


def test_threads_hammer_one_shared_pool_object(make_pool) -> None:
    params = dict(POOLS["8M-16K-fifo"])
    key_space, max_size = params.pop("key_space"), params.pop("max_size")
    pool = make_pool(**params)
    results: list[dict] = []
    crashed: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            results.append(
                hammer(
                    pool,
                    seed=seed,
                    seconds=SECONDS - 1,
                    key_space=key_space,
                    max_size=max_size,
                    mix=READ_HEAVY,
                )
            )
        except BaseException as exc:
            crashed.append(exc)

    threads = [threading.Thread(target=work, args=(100 + i,), daemon=True) for i in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SECONDS + 30)
    assert not any(thread.is_alive() for thread in threads), "a hammer thread is stuck"
    assert crashed == []
    assert len(results) == WORKERS
    _assert_consistent(pool, results)
