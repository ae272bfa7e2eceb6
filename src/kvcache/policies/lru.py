"""LRU: evict what was used least recently."""

from __future__ import annotations

import numpy as np

from .base import ScoreContext


class LRU:
    name = "lru"
    summary = "least recently used first; the safe default for chat and agent traffic"

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        return -records["last_access"].astype(np.float64)
