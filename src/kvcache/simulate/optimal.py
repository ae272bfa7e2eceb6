"""Belady's OPT for prompt traffic: the ceiling no eviction policy can pass.

Every request refers to all its blocks in order (a policy reads the cached
leading run and stores the rest), so every policy sees the same sequence of
block references. On a miss OPT keeps the block only if it is needed again
before the block in the cache needed farthest in the future, which it evicts
(bypassing a block is allowed: that is MIN, optimal for hits with equal
sizes). A block's ancestors are named by every request that names it, so
they are needed sooner: OPT evicts descendants first and its cache stays
closed under prefixes, so its block hits are all prefix hits. Any policy's
prefix hits are at most its block hits, which are at most OPT's.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from .outcome import Outcome, tally
from .traces import Trace

NEVER = np.iinfo(np.int64).max
"""The next use of a block that is not needed again."""


def next_uses(blocks: np.ndarray) -> np.ndarray:
    """For each read, the position of the next read of the same block, or ``NEVER``."""
    order = np.argsort(blocks, kind="stable")
    ordered = blocks[order]
    again = ordered[1:] == ordered[:-1]
    following = np.full(blocks.size, NEVER, dtype=np.int64)
    following[order[:-1][again]] = order[1:][again]
    return following


def replay_optimal(trace: Trace, capacity_blocks: int) -> Outcome:
    """Replay ``trace`` through Belady's OPT holding at most ``capacity_blocks`` blocks."""
    started = time.perf_counter()
    following = next_uses(trace.blocks).tolist()
    blocks = trace.blocks.tolist()
    starts = trace.starts.tolist()
    cached: dict[int, int] = {}  # block -> its next use
    farthest: list[tuple[int, int]] = []  # (-next use, block); stale items are skipped
    reused = np.zeros(trace.num_requests, dtype=np.int64)
    evictions = 0
    for request in range(trace.num_requests):
        leading = True
        for read in range(starts[request], starts[request + 1]):
            block, upcoming = blocks[read], following[read]
            if block in cached:
                reused[request] += leading
            else:
                leading = False
                if upcoming == NEVER:
                    continue
                if len(cached) >= capacity_blocks:
                    while cached.get(farthest[0][1]) != -farthest[0][0]:
                        heapq.heappop(farthest)
                    if -farthest[0][0] <= upcoming:
                        continue  # bypass: every cached block is needed sooner
                    del cached[heapq.heappop(farthest)[1]]
                    evictions += 1
            cached[block] = upcoming
            heapq.heappush(farthest, (-upcoming, block))
    return tally(trace, "opt", capacity_blocks, reused, evictions, time.perf_counter() - started)
