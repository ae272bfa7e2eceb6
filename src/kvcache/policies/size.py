"""SIZE: evict the largest entries first, freeing the most room per eviction."""

from __future__ import annotations

import numpy as np

from .base import ScoreContext


class Size:
    name = "size"
    summary = "largest first; keeps many small prefixes instead of a few long ones"

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        return records["num_pages"].astype(np.float64)
