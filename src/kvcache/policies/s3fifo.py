"""S3-FIFO (Yang et al., SOSP'23): a small probation queue in front of the main one.

Most cached objects are read once ("one-hit wonders"); S3-FIFO puts every new
entry in a small FIFO queue and evicts from it first while it holds more than
``PROBATION_SHARE`` of the entries, so such entries leave quickly without
pushing out what was read again. An entry read while on probation joins the
main queue; an entry put again soon after its eviction (the ghost table
remembers the keys evicted lately) skips probation.

As a score over sampled candidates: probation entries rank first while the
queue is over its share, oldest first (an entry on probation was never read,
so its last access is its insert); the main queue ranks least recently used
first, which is what its reinsertion of read entries approximates. Unlike the
paper's ghost, which holds the small queue's victims only, the ghost table
holds every evicted key: one put again soon was needed, whichever queue it
left.
"""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext

PROBATION_SHARE = 0.1
"""The small queue's share of the entries (the paper's 10%)."""


class S3FIFO:
    name = "s3fifo"
    summary = "new entries on probation first (small FIFO + main + ghost); keys mostly read once"
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = False
    uses_probation = True
    uses_sketch = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        if ctx.num_probation <= PROBATION_SHARE * ctx.num_live:
            return np.zeros(len(columns["probation"]))
        return (columns["probation"] != 0).astype(np.float64)
