"""PRIORITY: evict the lowest ``priority`` given at put first, least recent among equals."""

from __future__ import annotations

import numpy as np

from .base import ScoreContext


class Priority:
    name = "priority"
    summary = "lowest put(priority=...) first, then least recent; pin what you rank high"

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        return -records["priority"].astype(np.float64)
