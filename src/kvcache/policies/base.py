"""The policy interface and the victim ranking every policy shares.

A policy only scores candidate entries, all on one scale: higher is a better
victim (as Redis does). Everything else is shared here: expired entries rank
first under every policy, ties go to the least recently used, and the pool
does the freeing. Scores are computed with numpy over a batch of candidate
records, never with a Python loop per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ScoreContext:
    """What a score may depend on besides the records."""

    clock: int  # the pool's logical clock (one tick per put and per hit)
    now_s: float  # wall-clock seconds, for expiry
    lfu_half_life: int  # clock ticks after which an idle LFU count halves


class Policy(Protocol):
    """An eviction policy: a name, a one-line use case, and a vectorised score."""

    name: str
    summary: str

    def score(self, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
        """Victim score per record (``layout.ENTRY_DTYPE``); higher is evicted first."""
        ...


def decayed_frequency(records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
    """Access counts aged to ``ctx.clock``: halved every ``lfu_half_life`` idle ticks."""
    idle = ctx.clock - records["last_access"]
    return records["freq"] * np.exp2(-idle / ctx.lfu_half_life)


def rank_victims(policy: Policy, records: np.ndarray, ctx: ScoreContext) -> np.ndarray:
    """Order ``records`` best victim first: expired, then by score, then least recent."""
    score = np.asarray(policy.score(records, ctx), dtype=np.float64)
    score = np.where(records["expires_at"] <= ctx.now_s, np.inf, score)
    return np.lexsort((records["last_access"], -score))
