"""FIFO: evict what was stored first, whatever its use since."""

from __future__ import annotations

import numpy as np

from .base import ScoreContext


class FIFO:
    name = "fifo"
    summary = "oldest insert first; cheapest, for streams that are rarely reused"

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        return -records["created"].astype(np.float64)
