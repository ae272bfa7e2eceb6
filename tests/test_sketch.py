"""The request counts of prefix pools (kvcache.sketch): what a count raises, when counts
halve, where the sketch lives, and that a pool with one is format 12."""

from __future__ import annotations

import numpy as np
import pytest

import kvcache
from kvcache import native, sketch
from kvcache.errors import IncompatiblePoolError
from kvcache.keys import key_hash
from kvcache.layout import H
from kvcache.sketch import LIMIT, PERIOD, RequestCounts
from pool_files import set_format_version

COUNTED_WORD = 0


def counts_for(max_entries: int) -> tuple[RequestCounts, bytearray, memoryview]:
    region = bytearray(sketch.bytes_for(max_entries))
    header = memoryview(bytearray(8)).cast("q")
    return RequestCounts(memoryview(region), header, COUNTED_WORD, max_entries), region, header


def test_a_request_raises_only_the_smallest_of_its_keys_counters() -> None:
    counts, region, _ = counts_for(64)
    lo, hi = key_hash(b"chunk")
    mask = len(region) - 1
    spots = [lo & mask, lo >> 32 & mask, hi & mask, hi >> 32 & mask]
    assert len(set(spots)) == 4  # four distinct counters for this key
    region[spots[0]] = 5  # another key shares this counter
    counts.count(lo, hi)
    assert [region[s] for s in spots] == [5, 1, 1, 1]
    assert counts.asked(lo, hi) == 1
    for _ in range(3):
        counts.count(lo, hi)
    assert [region[s] for s in spots] == [5, 4, 4, 4]
    counts.count(lo, hi)  # all four at 5 now
    for _ in range(2 * LIMIT):
        counts.count(lo, hi)
    assert counts.asked(lo, hi) == LIMIT
    assert sum(region) == 4 * LIMIT  # nothing else was raised


def test_counts_halve_every_period_and_a_damaged_counted_word_halves_them_early() -> None:
    counts, _, header = counts_for(2)
    lo, hi = key_hash(b"hot")
    for _ in range(10):
        counts.count(lo, hi)
    assert counts.asked(lo, hi) == 10 and header[COUNTED_WORD] == 10
    for _ in range(PERIOD * 2 - 11):
        counts.count(lo, hi)
    assert counts.asked(lo, hi) == LIMIT
    counts.count(lo, hi)  # the period's last count: everything halves
    assert counts.asked(lo, hi) == LIMIT // 2 and header[COUNTED_WORD] == 0
    for damaged in (-1, PERIOD * 2, 1 << 62):
        before = counts.asked(lo, hi)
        header[COUNTED_WORD] = damaged
        counts.count(lo, hi)
        assert header[COUNTED_WORD] == 0 and counts.asked(lo, hi) == (before + 1) // 2


def test_the_sketch_grows_with_the_entry_slots_to_a_limit() -> None:
    assert sketch.bytes_for(1) == 16
    assert sketch.bytes_for(1000) == 16384  # 16,000 rounded up to a power of two
    assert sketch.bytes_for(1 << 30) == sketch.MAX_BYTES


def test_only_a_prefix_pool_counts_requests_and_is_written_as_format_12(names) -> None:
    plain, prefix = names(), names()
    with kvcache.create(plain, "64K", page_size="1K", policy="arc") as pool:
        views = pool._engine.views
        assert views.header_q[H.format_version] == 10 and len(views.sketch) == 0
    with kvcache.create(prefix, "64K", page_size="1K", policy="prefix") as pool:
        views, path = pool._engine.views, pool.path
        assert views.header_q[H.format_version] == 12
        assert len(views.sketch) == sketch.bytes_for(64)
        pool.put("root", b"r")
        assert pool.get("root") == b"r"
        lo, hi = key_hash(b"root")
        assert pool._engine.table.queues.counts.asked(lo, hi) == 2  # the put and the hit
        assert views.header_q[H.sketch_counted] == 2
    set_format_version(path, 10)  # a kvcache that reads 10 must not take it for its own
    with pytest.raises(IncompatiblePoolError, match="format version 10, this kvcache"):
        kvcache.open(prefix)


def test_the_compiled_hit_counts_as_python_counts(names) -> None:
    """Both engines count a hit the same way, up to the counters' limit and across a
    halving: the sketches are equal, byte for byte, at each step."""
    steps: list[list[np.ndarray]] = []
    for pure in (False, True):
        name = names()
        with kvcache.create(name, "64K", page_size="1K", policy="prefix") as pool:
            if pure:
                pool._engine.table.fast = None  # every hit through the Python path
            else:
                assert pool._engine.table.fast is not None or native.Finder is None
            views, period = pool._engine.views, sketch.period_for(64)
            seen = []

            def counts() -> np.ndarray:
                return np.frombuffer(views.sketch, np.uint8).copy()  # noqa: B023

            for key in ("a", "b", "c"):
                pool.put(key, b"v")
            for key in ("a", "a", "b", "missing"):
                pool.get(key)
            assert views.header_q[H.sketch_counted] == 6
            seen.append(counts())
            for _ in range(LIMIT + 5):
                pool.get("a")
            assert counts().max() == LIMIT  # "a"'s counters stop at the limit
            seen.append(counts())
            for i in range(period):  # the hit that reaches the period halves every counter
                pool.get("bc"[i % 2])
            assert views.header_q[H.sketch_counted] < period
            seen.append(counts())
            steps.append(seen)
    compiled, pure_python = steps
    assert compiled[0].any()
    for here, there in zip(compiled, pure_python, strict=True):
        assert np.array_equal(here, there)
