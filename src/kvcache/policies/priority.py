"""PRIORITY: evict the lowest ``priority`` given at put first, least recent among equals."""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class Priority:
    name = "priority"
    summary = "lowest put(priority=...) first, then least recent; pin what you rank high"
    fields: tuple[str, ...] = ("priority",)
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -columns["priority"].astype(np.float64)
