"""FIFO: evict what was stored first, whatever its use since."""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class FIFO:
    name = "fifo"
    summary = "oldest insert first; cheapest, for streams that are rarely reused"
    fields: tuple[str, ...] = ("created",)
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -columns["created"].astype(np.float64)
