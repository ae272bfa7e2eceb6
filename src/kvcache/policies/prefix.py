"""Prefix: for PrefixCache pools; a chunk goes with its prefix, and only chunks asked for
more often than what they would evict get in.

Three facts about prompt traffic drive it (docs/simulate.md, "Choosing a policy"):

- A chunk is reachable only through its parent, so a chunk whose ancestor is
  gone only takes room: the pool keeps the chunk tree (``kvcache.tree``),
  removes a chunk's descendants with it and never stores a chunk whose parent
  is not here. Ranking is plain LRU over that tree. A prompt's chunks are read
  in order, so a chunk is never used less lately than its descendants: the
  least recently used chunk takes with it only chunks as cold as itself, and
  a shared root (a system prompt, a document) stays as long as anything below
  it is read, since every read of a descendant reads it too.
- Most chunks are the unique tail of one prompt and are never asked for again,
  while a few (shared documents, a conversation's earlier turns) are asked
  for again and again. The pool keeps a frequency sketch of every key asked
  for, cached or not (``kvcache.sketch``: 4-bit count-min counters in the
  segment, halved every few pool-fulls of accesses), and a new chunk that
  would evict is admitted only if the sketch has seen it asked for more often
  than the least recently used chunk is being used (its sketch count when
  last used, halved for every ``lfu_half_life`` ticks idle since): TinyLFU.
  Declining a chunk declines the rest of its prompt (no parent), so a
  one-off tail costs one comparison instead of flushing the cache.
- What ages out is what nothing asks for: a victim idle for long is worth
  less than any newcomer, so when the traffic moves on the cache follows,
  as LRU's would.

There is nothing to tune: the only constants are TinyLFU's (4 counters per
key, 4 bits each, halving after 4 additions per sketch word) and the pool's
LFU half-life.
"""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class Prefix:
    name = "prefix"
    summary = (
        "PrefixCache pools (the default with --prefix-cache): chunks go with their prefix, "
        "new ones get in if asked for often"
    )
    fields: tuple[str, ...] = ("last_access",)
    tracks_prefixes = True
    uses_queues = False
    uses_sketch = True

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -columns["last_access"].astype(np.float64)
