"""SIZE: evict the largest entries first, freeing the most room per eviction."""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class Size:
    name = "size"
    summary = "largest first; keeps many small prefixes instead of a few long ones"
    fields: tuple[str, ...] = ("num_pages",)
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return columns["num_pages"].astype(np.float64)
