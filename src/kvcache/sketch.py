"""A bounded frequency sketch in the segment: about how often each key was asked for lately.

The ``prefix`` policy's memory of keys across their evictions (TinyLFU, Einziger
et al., 2017): every hit and every put of a key adds to its count, whether or
not the key is cached, so a chunk evicted and asked for again is known for how
often it was asked for. It lives in the region that other probation policies
use as their ghost table (``layout``: index_slots words), read as 4-bit
counters, 16 to a word::

    word:   | c15 | c14 | ... | c1 | c0 |     bits 63..60 ... 3..0

A key's count is the least of its four counters (a count-min sketch), chosen by
the four 32-bit quarters of its 128-bit hash; an addition raises only the
counters at that least value (conservative update), up to 15. After
``AGING_ADDITIONS_PER_SLOT`` additions per word every counter halves
(TinyLFU's reset), so counts describe the last several pool-fulls of
accesses, not all time; the additions since are the header's ``sketch_additions``.

No count is ever wrong enough to harm the pool: a crash mid-addition or
mid-halving leaves counters that are merely a little off, so repair leaves
them be (it only resets an out-of-range addition count).
"""

from __future__ import annotations

import numpy as np

from .layout import H, Views

COUNTERS_PER_WORD = 16
COUNT_LIMIT = 15
AGING_ADDITIONS_PER_SLOT = 4
"""Additions between halvings, per word of the sketch. Index slots are 2-4 x the pool's
entries, so counts span 8-16 pool-fulls of accesses: TinyLFU's sample is 10 x the
cache's size (a longer one keeps the counts of keys gone cold for longer; 8 per slot
lost 1-2 points at 1% capacity on a synthetic conversation trace)."""
_HALVE_MASK = np.uint64(0x7777_7777_7777_7777)  # each counter shifted right, no carry in


class FrequencySketch:
    """The counts of keys by hash, over ``views``' ghost region (see the module)."""

    def __init__(self, views: Views) -> None:
        self._q = views.ghost_uq
        self._hq = views.header_q
        self._mask = len(views.ghost_uq) * COUNTERS_PER_WORD - 1  # slots are a power of two
        self._window = AGING_ADDITIONS_PER_SLOT * len(views.ghost_uq)

    def _counters(self, lo: int, hi: int) -> tuple[int, int, int, int]:
        mask = self._mask
        return lo & mask, (lo >> 32) & mask, hi & mask, (hi >> 32) & mask

    def _least(self, counters: tuple[int, int, int, int]) -> int:
        q = self._q
        return min((q[c >> 4] >> ((c & 15) << 2)) & 15 for c in counters)

    def estimate(self, lo: int, hi: int) -> int:
        """The count of the key hashed ``(lo, hi)``."""
        return self._least(self._counters(lo, hi))

    def add(self, lo: int, hi: int) -> int:
        """Count one more ask for the key hashed ``(lo, hi)``; its count after."""
        q = self._q
        counters = self._counters(lo, hi)
        least = self._least(counters)
        if least < COUNT_LIMIT:
            for c in counters:
                word, shift = c >> 4, (c & 15) << 2
                if (q[word] >> shift) & 15 == least:
                    q[word] += 1 << shift  # below the limit: no carry into the next counter
            least += 1
        h = self._hq
        h[H.sketch_additions] += 1
        if h[H.sketch_additions] >= self._window:
            h[H.sketch_additions] = 0
            words = np.frombuffer(self._q, np.uint64)  # not kept: close releases the mapping
            words[:] = (words >> np.uint64(1)) & _HALVE_MASK
        return least

    def raise_to(self, lo: int, hi: int, count: float) -> None:
        """Make the key's count at least ``count`` (capped): a restored or promoted entry's
        access count, which under ``prefix`` is its count here when last used."""
        q, target = self._q, min(COUNT_LIMIT, round(count))
        for c in self._counters(lo, hi):
            word, shift = c >> 4, (c & 15) << 2
            now = (q[word] >> shift) & 15
            if now < target:
                q[word] += (target - now) << shift


def admits(count: float, victim_frequency: float) -> bool:
    """TinyLFU's admission: a new key that would evict is stored only if asked for more often
    (its sketch ``count``, this put included) than the victim is used (its access count
    aged, ``policies.base.decayed_frequency``, which starts at its own count when stored).
    A key asked for once never displaces one hit lately; a victim idle for long ages below
    any newcomer, so a burst of new keys still gets in once the old ones go cold."""
    return count > victim_frequency
