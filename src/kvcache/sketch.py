"""How often each key was asked for lately: a count-min sketch in the segment (format 12).

``prefix`` admits probation's oldest chunk to main, instead of evicting it, when it
was asked for more often than main's least recently used chunk (TinyLFU's admission,
Einziger et al., ACM TOS 2017; ties go to the chunk nearer the root). That needs
counts of keys that are no longer held, many times more keys than the pool holds, in
little memory: a count-min sketch of one-byte counters, ``PER_ENTRY`` per entry slot
(16 bytes per entry against its 256-byte record). A key's four counters sit at four
32-bit fields of its 128-bit hash (the hash the key index stores); a request raises
only those of the four that hold the smallest count (the conservative update, which
keeps collisions from inflating counts), up to ``LIMIT``, and every ``PERIOD``
counts per entry slot all counters halve, so the counts follow what is asked for
now.

Every count is taken under the pool's lock (a hit of a queue policy and a put
take it), in Python here and in C (``lookup.c``, ``count_request``) the same
way, store for store. The counts only steer eviction: a damaged counter changes
one admission, and a damaged ``sketch_counted`` word halves the counts early.
"""

from __future__ import annotations

import numpy as np

PER_ENTRY = 16
"""Counters per entry slot: with four per key, the sketch holds four counters per key of
the four keys' worth of requests the pool has room for, enough that the smallest of a
key's four is rarely raised by other keys."""
LIMIT = 15
"""The largest count: a chunk asked for 15 times lately is as hot as it needs to be."""
PERIOD = 40
"""Counts per entry slot between two halvings: the counts remember about forty pools'
worth of requests. Measured on generated chat and conversation traces, 10 (Caffeine's
choice) to 80 changed the hit ratio at 1-2% by up to 0.7 points, best from 40 up."""
MAX_BYTES = 1 << 28
"""The largest sketch (256 MiB, a pool of 16 million entry slots): a larger one would not
fit four 32-bit fields of the hash, and more counters stop paying for themselves."""


def bytes_for(max_entries: int) -> int:
    """The sketch of a pool with ``max_entries`` entry slots: a power of two, at most
    ``MAX_BYTES``."""
    return min(1 << (PER_ENTRY * max_entries - 1).bit_length(), MAX_BYTES)


def period_for(max_entries: int) -> int:
    """The counts between two halvings of the sketch of a pool with ``max_entries`` entry
    slots (the Python and the compiled count take it from here)."""
    return PERIOD * max_entries


class RequestCounts:
    """The sketch of one mapped segment, counted and read under the pool's lock."""

    def __init__(
        self, sketch: memoryview, header_q: memoryview, counted_word: int, max_entries: int
    ) -> None:
        self._counts = sketch
        self._array = np.frombuffer(sketch, np.uint8)
        self._h, self._counted = header_q, counted_word  # counts since the last halving
        self._mask = len(sketch) - 1
        self._period = period_for(max_entries)

    def _spots(self, hash_lo: int, hash_hi: int) -> tuple[int, int, int, int]:
        mask = self._mask
        return hash_lo & mask, hash_lo >> 32 & mask, hash_hi & mask, hash_hi >> 32 & mask

    def asked(self, hash_lo: int, hash_hi: int) -> int:
        """How often the key of this hash was asked for lately (its smallest counter)."""
        counts = self._counts
        a, b, c, d = self._spots(hash_lo, hash_hi)
        return min(counts[a], counts[b], counts[c], counts[d])

    def count(self, hash_lo: int, hash_hi: int) -> None:
        """One request for the key of this hash; every ``PERIOD`` per entry slot, halve all."""
        counts = self._counts
        spots = a, b, c, d = self._spots(hash_lo, hash_hi)
        least = min(counts[a], counts[b], counts[c], counts[d])
        if least < LIMIT:
            for spot in spots:
                if counts[spot] == least:
                    counts[spot] = least + 1
        h, word = self._h, self._counted
        counted = h[word]
        if 0 <= counted < self._period - 1:
            h[word] = counted + 1
        else:  # the period is over (or the word is damaged): halve
            self._array >>= 1
            h[word] = 0
