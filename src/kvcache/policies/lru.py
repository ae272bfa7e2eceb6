"""LRU: evict what was used least recently."""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class LRU:
    name = "lru"
    summary = "least recently used first; the default for pools of other values than prompt chunks"
    fields: tuple[str, ...] = ("last_access",)
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -columns["last_access"].astype(np.float64)
