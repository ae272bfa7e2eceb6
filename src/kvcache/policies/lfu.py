"""LFU with aging: evict what is used least often lately.

Each entry keeps an access count that halves every ``lfu_half_life`` clock
ticks without a hit, so a prefix that was hot yesterday does not squat
forever (plain LFU's failure); ties go to the least recently used.
"""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext, decayed_frequency


class LFU:
    name = "lfu"
    summary = "least frequently used first (counts age); keeps shared system prompts hot"
    fields: tuple[str, ...] = ("freq", "last_access")
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -decayed_frequency(columns, ctx)
