"""ARC (Megiddo and Modha, FAST'03): recency and frequency, balanced by what was evicted.

ARC keeps two lists, entries seen once (T1: here, entries on probation) and
entries seen again (T2), and a target size p for T1. It evicts the least
recently used of T1 while T1 holds more than p entries, else of T2. Its ghost
lists remember the keys each list evicted lately: a key put again that T1
evicted means T1 was too small (p grows), one that T2 evicted means T2 was
(p shrinks). A recalled key joins T2.

Here the ghosts are the pool's direct-mapped ghost table (a key's slot keeps
one bit for the list it left, and the header counts the words of each kind),
and p is the header's ``probation_target``; a recall moves it by ARC's step,
the ratio of the other list's ghosts to this one's (at least one entry).
"""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class ARC:
    name = "arc"
    summary = "balances recency and frequency by its evictions' ghosts; when the reuse mix shifts"
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = False
    uses_probation = True
    uses_sketch = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        on_probation = columns["probation"] != 0
        probation_first = ctx.num_probation > ctx.probation_target
        return (on_probation == probation_first).astype(np.float64)
