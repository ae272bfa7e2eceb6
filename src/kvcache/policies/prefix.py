"""Prefix: for PrefixCache pools; leaves first, new chunks on probation, evicted keys remembered.

Three facts about prompt traffic drive it (README, "Choosing a policy"):

- A chunk is reachable only through its parent, so evicting a chunk that
  others build on strands them (the pool removes them with it, see
  ``kvcache.tree``). It ranks leaves first: shared roots (system prompts,
  documents) stay while anything hangs below them, which is exactly while
  they are used. LRU does the opposite: a prompt's first chunk was touched
  before its last, so it goes first and takes the rest with it.
- Most chunks are the unique tail of one prompt and are never read again,
  and a chunk's first reuse, if any, comes much later than its later ones
  (on the Mooncake trace: 42% of new chunks are reused, after a median 573
  requests; a chunk read twice is read again 84% of the time). New chunks
  start on probation; while probation holds more than its share, its
  oldest leaves go first (S3-FIFO's small queue), so tails that are never
  reused do not flush what is.
- The pool remembers the keys it evicted lately (a ghost table as large as
  its index): a chunk put again soon after its eviction was needed, and
  skips probation. Where chunks are first reused soon (the next turn of a
  conversation), recalls of chunks evicted from probation grow its share as
  ARC grows its recency list (``arc``); it never drops below
  ``PROBATION_SHARE`` (10%, S3-FIFO's). On the Mooncake trace a fixed 30%
  did no better than 10%, and on a synthetic conversation trace a fixed 10%
  lost to LRU at 10-20% capacity, which the adaptive share mostly recovers.

Ties, and each class, go least recently used first.
"""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext
from .s3fifo import PROBATION_SHARE


class Prefix:
    name = "prefix"
    summary = "prompt chunks: leaves first, new chunks on probation; the best for PrefixCache pools"
    fields: tuple[str, ...] = ("first_child", "probation")
    tracks_prefixes = True
    uses_probation = True

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        leaf = columns["first_child"] == 0
        if ctx.num_probation <= max(ctx.probation_target, PROBATION_SHARE * ctx.num_live):
            return leaf.astype(np.float64)
        return leaf * (1.0 + (columns["probation"] != 0))
