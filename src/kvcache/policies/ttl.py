"""TTL: evict what expires soonest; entries without expiry go last."""

from __future__ import annotations

import numpy as np

from .base import Columns, ScoreContext


class TTL:
    name = "ttl"
    summary = "soonest expiry first (no ttl = last); for time-bounded sessions"
    fields: tuple[str, ...] = ("expires_at",)
    tracks_prefixes = False
    uses_queues = False
    counts_requests = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return -columns["expires_at"]
