"""Operational counters kept in the segment (format 6): what ``kvcache.metrics`` exports.

The header (``layout``) keeps the counters the pool needed from the start (hits,
misses, puts, evictions, expirations, spills, promotions, the remote tier's). This
region holds the rest, for operators: bytes in and out, explicit evictions, failed
puts, token counters of ``PrefixCache`` by model, and latency histograms. It is its
own 4 KiB right after the header, so that neither grows into the other::

    METRICS_OFFSET = 4096 (layout)
    +----------------------------------+
    | counters     8 words             |  bytes_in, bytes_out, evictions_explicit,
    |                                  |  errors, reset_at (f8), 3 spare
    | latency      4 ops x 25 words    |  get, put, lookup, retrieve: samples that
    |                                  |  took <= 2**i us (i < 24), then the rest
    | latency_ns   4 words             |  nanoseconds summed per op
    | model_names  16 x 64 bytes       |  PrefixCache model ids, first come first
    |                                  |  served; empty = free
    | model_tokens 17 x 3 words        |  queried, hit, stored; row 16 = "other"
    +----------------------------------+

Every word is changed under the pool lock, so counts from all processes add up
and outlive them; ``Pool.reset_stats`` zeroes them all (and the header's).

Two things are kept back in each process and added to the region together, so that
a 4 KiB get or put pays for no word of its own: the value bytes in and out (a
memoryview word costs ~0.1 us to add to, ~1.5% of a 4 KiB get) and latency. Latency
is sampled: one call in ``DEFAULT_SAMPLE_EVERY`` of each op is timed, and each
sample is added at once with the bytes the process kept back meanwhile, in one lock
hold (and at ``Pool.stats``, ``Pool.metrics`` and close). So another process sees a
process's bytes at most 127 of its gets or puts late. Timing every op costs ~30% of
a 4 KiB get's throughput on the 2-core VM (``benchmarks/bench_metrics.py``, docs/operations.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

import numpy as np

from .errors import InvalidArgument
from .layout import METRICS_BYTES, _WordIndex

OPS = ("get", "put", "lookup", "retrieve")
GET, PUT, LOOKUP, RETRIEVE = range(len(OPS))
NUM_BUCKETS = 25
LATENCY_BOUNDS_S = tuple(1e-6 * 2**i for i in range(NUM_BUCKETS - 1))
"""Upper bounds of the latency buckets: 1 us, 2 us, 4 us ... 8.4 s; the last bucket is +Inf."""
MAX_MODELS = 16
OTHER_MODEL = "other"
"""The label of every model beyond the first ``MAX_MODELS`` (bounded label cardinality)."""
MODEL_NAME_BYTES = 64
TOKEN_COUNTERS = ("queried", "hit", "stored")
COUNTER_NAMES = ("bytes_in", "bytes_out", "evictions_explicit", "errors")

METRICS_DTYPE = np.dtype(
    [
        ("bytes_in", "<i8"),  # value bytes published (puts, restores, spills and promotions in)
        ("bytes_out", "<i8"),  # value bytes of hits
        ("evictions_explicit", "<i8"),  # entries removed by Pool.evict (kvcache evict)
        ("errors", "<i8"),  # puts refused: no room, or no memory to grow into
        ("reset_at", "<f8"),  # wall clock of the last reset_stats; 0 = never
        ("spare", "<i8", (3,)),
        ("latency", "<i8", (len(OPS), NUM_BUCKETS)),
        ("latency_ns", "<i8", (len(OPS),)),
        ("model_names", f"S{MODEL_NAME_BYTES}", (MAX_MODELS,)),
        ("model_tokens", "<i8", (MAX_MODELS + 1, len(TOKEN_COUNTERS))),
    ]
)
assert METRICS_DTYPE.itemsize <= METRICS_BYTES

M = _WordIndex(METRICS_DTYPE)
"""Word index of each field of the region: ``metrics_q[M.bytes_in]``."""
SAMPLE_ENV = "KVCACHE_LATENCY_SAMPLE"
DEFAULT_SAMPLE_EVERY = 128
_NEVER = 1 << 62


def sample_every() -> int:
    """Every how many ops a process times one: ``$KVCACHE_LATENCY_SAMPLE`` (0 = never),
    default ``DEFAULT_SAMPLE_EVERY``."""
    text = os.environ.get(SAMPLE_ENV, "").strip()
    if not text:
        return DEFAULT_SAMPLE_EVERY
    if not text.isdigit():
        raise InvalidArgument(f"{SAMPLE_ENV} must be a whole number (0 = off), not {text!r}")
    return int(text)


def bucket_of(ns: int) -> int:
    """The latency bucket of an op that took ``ns`` nanoseconds."""
    return min(((max(ns, 1) - 1) // 1000).bit_length(), NUM_BUCKETS - 1)


class Latency:
    """One process's latency sampler for one pool: times one call in ``every`` of each op.

    ``start`` is on every call's path, so it is a countdown and nothing more
    (``Pool.get`` and ``Pool.put`` count down inline instead: the method call
    alone is half its cost); ``stop`` hands a sampled call's nanoseconds to
    ``record`` (``Pool``'s: it adds them to the region under the pool lock).
    """

    def __init__(self, every: int, record: Callable[[int, int], None]) -> None:
        self.every = every if every > 0 else _NEVER
        # One countdown per op: a shared one would sample only one op of a process that
        # alternates them (put, get, put, get ... with an even ``every``).
        self._countdowns = [self.every] * len(OPS)
        self._record = record

    def start(self, op: int) -> int:
        """A start time if this call of ``op`` is sampled, else 0."""
        countdowns = self._countdowns
        countdowns[op] -= 1
        if countdowns[op]:
            return 0
        countdowns[op] = self.every
        return time.perf_counter_ns()

    def stop(self, op: int, started_ns: int) -> None:
        """Record a sampled call of ``op`` that began at ``started_ns``."""
        self._record(op, time.perf_counter_ns() - started_ns)


class MetricsRegion:
    """The region's words, changed under the pool's lock (``lock``)."""

    def __init__(self, raw: memoryview, lock: AbstractContextManager[object]) -> None:
        self._raw = raw
        self.q = raw.cast("q")
        self._d = raw.cast("d")
        self._lock = lock
        self._rows: dict[str, int] = {}  # model -> row, as last found here (checked each use)

    def add(self, bytes_in: int, bytes_out: int, samples: Iterable[tuple[int, int]] = ()) -> None:
        """Add what a process kept back: value bytes, and latency samples (op, ns: an
        ``op`` that took ``ns``); call under the lock."""
        q = self.q
        q[M.bytes_in] += bytes_in
        q[M.bytes_out] += bytes_out
        for op, ns in samples:
            q[M.latency + op * NUM_BUCKETS + bucket_of(ns)] += 1
            q[M.latency_ns + op] += ns

    def count_tokens(self, model: str, queried: int = 0, hit: int = 0, stored: int = 0) -> None:
        """Add to ``model``'s token counters (the ``other`` row once all rows are taken)."""
        name = model.encode()[:MODEL_NAME_BYTES]
        with self._lock:
            base = M.model_tokens + self._row(model, name) * len(TOKEN_COUNTERS)
            q = self.q
            q[base] += queried
            q[base + 1] += hit
            q[base + 2] += stored

    def _row(self, model: str, name: bytes) -> int:
        raw = self._raw
        row = self._rows.get(model)
        if row is not None and self._name_at(raw, row) == name:
            return row
        for row in range(MAX_MODELS):
            held = self._name_at(raw, row)
            if held == name or not held:
                if not held:
                    start = M.model_names * 8 + row * MODEL_NAME_BYTES
                    raw[start : start + MODEL_NAME_BYTES] = name.ljust(MODEL_NAME_BYTES, b"\0")
                self._rows[model] = row
                return row
        return MAX_MODELS

    @staticmethod
    def _name_at(raw: memoryview, row: int) -> bytes:
        start = M.model_names * 8 + row * MODEL_NAME_BYTES
        return bytes(raw[start : start + MODEL_NAME_BYTES]).rstrip(b"\0")

    def read(self) -> np.ndarray:
        """A copy of the region (a ``METRICS_DTYPE`` record); call under the lock."""
        return np.frombuffer(self.q, METRICS_DTYPE, count=1)[0].copy()

    def reset(self, now_s: float) -> None:
        """Zero every word and note when; call under the lock."""
        self._raw[: METRICS_DTYPE.itemsize] = bytes(METRICS_DTYPE.itemsize)
        self._d[M.reset_at] = now_s
        self._rows.clear()

    def repair(self) -> None:
        """Zero counters a damaged segment left out of range; call under the lock."""
        counters = np.frombuffer(self.q, np.int64, count=METRICS_DTYPE.itemsize // 8)
        names = slice(M.model_names, M.model_names + MAX_MODELS * MODEL_NAME_BYTES // 8)
        for index in range(len(counters)):
            if index == M.reset_at or names.start <= index < names.stop:
                continue
            if counters[index] < 0:
                counters[index] = 0
