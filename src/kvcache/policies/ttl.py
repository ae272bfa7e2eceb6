"""TTL: evict what expires soonest; entries without expiry go last."""

from __future__ import annotations

import numpy as np

from .base import ScoreContext


class TTL:
    name = "ttl"
    summary = "soonest expiry first (no ttl = last); for time-bounded sessions"

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        return -records["expires_at"]
