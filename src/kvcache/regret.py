"""Eviction regret: how soon keys the pool evicted are asked for again.

A pool that is too small evicts keys that come back soon: each such request is
a miss that a larger pool would have served. We keep a bounded sample of
evicted keys in the segment and, when a sampled key is asked for again (a get
that misses, or a put of a key the pool does not hold, whichever comes first),
count the time and the accesses since its eviction in two histograms, as
LMCache exports its evict-to-reuse gap. An operator reads them as: most
regretted keys came back within a few times the pool's entries in accesses,
so a larger pool would have kept them; or they came back after hours, and
no size would.

**Sampling by key hash** (SHARDS: Waldspurger et al., FAST'15). A key is in
the sample when the low ``shift`` bits of its hash's high word are zero, so
the same key always is or is not, and each of its evictions and requests is
seen. ``shift`` is chosen from the entry slots so that the ring of
``NUM_RECORDS`` records spans about twice the entry slots in evictions: a key
that comes back later than that counts as not asked for again within the ring
(``unrequested``), neither in the histograms nor lost.

**Layout**, words at the end of the header (format 9; all zeros is an empty
sample)::

    regret_next            records ever written: the next one's ring position
    regret_unrequested     records pushed out before their key was asked for
    regret_seconds    x25  asked for again <= 2**(i - 4) s after (1/16 s .. 6 days), +Inf
    regret_seconds_sum     (float) their seconds
    regret_accesses   x32  asked for again <= 2**i accesses after (1 .. 2**30), +Inf
    regret_accesses_sum    their accesses
    regret_ring      64x3  per record: key hash low word | 1 (0 = empty),
                           evicted at (wall clock, float), evicted at (logical clock)

Accesses are the pool's logical clock: one tick per put and per hit.
Everything is changed under the pool lock, so every process adds to one sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .layout import CLOCK_LIMIT, ENTRY_WORDS, E, H, Views
from .reports import Regret, RegretHistogram

NUM_RECORDS = 64
"""Evicted keys the sample holds at once (3 header words each)."""
RECORD_WORDS = 3
SECONDS_BOUNDS = tuple(2.0**i for i in range(-4, 20))
"""Upper bounds of the time buckets: 1/16 s, 1/8 s ... 2**19 s (6 days); then +Inf."""
ACCESS_BOUNDS = tuple(float(2**i) for i in range(31))
"""Upper bounds of the access buckets: 1, 2, 4 ... 2**30 accesses; then +Inf."""
SPAN_SLOTS = 2
"""The ring spans about this many times the pool's entry slots in evictions."""


def sample_shift(max_entries: int) -> int:
    """Keys are sampled at 1 in ``2**shift``: the ring then spans about ``SPAN_SLOTS``
    times ``max_entries`` evictions."""
    wanted = SPAN_SLOTS * max_entries / NUM_RECORDS
    return max(0, math.ceil(math.log2(wanted))) if wanted > 1 else 0


class RegretSample:
    """The sample in the segment; see the module's overview. Callers hold the pool lock."""

    def __init__(self, views: Views) -> None:
        self._h, self._hd, self._q = views.header_q, views.header_d, views.entries_q
        self._mask = (1 << sample_shift(views.geometry.max_entries)) - 1
        self._ring = H.regret_ring

    def evict(self, chain: list[int], now_s: float) -> None:
        """The entries of ``chain`` are about to be evicted (a victim and, in a prefix-tracking
        pool, the chunks below it: ``Table.chain``): remember their keys in the sample."""
        q, mask = self._q, self._mask
        for each in chain:
            base = each * ENTRY_WORDS
            if not q[base + E.hash_hi] & mask:
                self._remember(q[base + E.hash_lo], now_s)

    def _remember(self, lo: int, now_s: float) -> None:
        h = self._h
        position = h[H.regret_next]
        base = self._ring + (position % NUM_RECORDS) * RECORD_WORDS
        if h[base]:
            h[H.regret_unrequested] += 1  # pushed out before its key came back
        h[base] = lo | 1
        self._hd[base + 1] = now_s
        h[base + 2] = h[H.clock]
        h[H.regret_next] = position + 1

    def request(self, lo: int, hi: int, clock: Callable[[], float]) -> None:
        """A key the pool does not hold is asked for: count its gap if it was evicted lately
        (``clock`` is read only for a sampled key)."""
        if hi & self._mask:
            return
        # a numpy view made per call: one kept would pin the mapping open after close
        words = np.frombuffer(self._h, np.int64)
        keys = words[self._ring : self._ring + NUM_RECORDS * RECORD_WORDS : RECORD_WORDS]
        found = np.flatnonzero(keys == (lo | 1))
        if not found.size:
            return
        h, d = self._h, self._hd
        base = self._ring + int(found[0]) * RECORD_WORDS
        seconds = max(0.0, clock() - d[base + 1])
        accesses = max(0, h[H.clock] - h[base + 2])
        h[base] = 0
        h[H.regret_seconds + bucket(seconds, SECONDS_BOUNDS)] += 1
        d[H.regret_seconds_sum] += seconds
        h[H.regret_accesses + bucket(accesses, ACCESS_BOUNDS)] += 1
        h[H.regret_accesses_sum] += accesses

    def read(self) -> Regret:
        h, d = self._h, self._hd
        seconds = [h[H.regret_seconds + i] for i in range(len(SECONDS_BOUNDS) + 1)]
        accesses = [h[H.regret_accesses + i] for i in range(len(ACCESS_BOUNDS) + 1)]
        return Regret(
            RegretHistogram(tuple(seconds), d[H.regret_seconds_sum], SECONDS_BOUNDS),
            RegretHistogram(tuple(accesses), h[H.regret_accesses_sum], ACCESS_BOUNDS),
            h[H.regret_unrequested],
            self._mask + 1,
        )

    def reset(self) -> None:
        """Zero the histograms and forget the sample (``Pool.reset_stats``)."""
        words = np.frombuffer(self._h, np.int64)
        words[H.regret_next : H.regret_ring + NUM_RECORDS * RECORD_WORDS] = 0


def find_problems(views: Views) -> list[str]:
    """Words of the sample out of their range (``Pool.check``): a count or clock past
    ``CLOCK_LIMIT`` would overflow its word at the next request. Repair clears the sample:
    it is statistics, and a damaged one cannot be trusted in part."""
    h, d = views.header_q, views.header_d
    counts = np.frombuffer(h, np.int64)
    counts = np.concatenate(
        [
            counts[H.regret_next : H.regret_seconds_sum],
            counts[H.regret_accesses : H.regret_ring],
            counts[H.regret_ring + 2 : H.regret_ring + NUM_RECORDS * RECORD_WORDS : RECORD_WORDS],
        ]
    )
    seconds = d[H.regret_seconds_sum]
    if ((counts < 0) | (counts >= CLOCK_LIMIT)).any() or not 0 <= seconds < math.inf:
        return ["eviction regret sample has words out of range (repair clears it)"]
    return []


def bucket(value: float, bounds: tuple[float, ...]) -> int:
    """The first bucket whose bound is at least ``value`` (len(bounds): +Inf)."""
    return int(np.searchsorted(bounds, value))
