"""What one replay of a trace at one capacity achieved, and how it is tallied."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..reports import Regret
from .traces import Trace

DEFAULT_PREFILL_TOKENS_PER_S = 5000
"""What saved prefill is reckoned at unless told: about an 8B model's prefill of long
prompts on one consumer GPU (``--prefill-rate`` gives the user's own)."""


@dataclass(frozen=True)
class Outcome:
    """One policy at one capacity over one trace.

    A request reuses the leading run of its blocks that is cached (a prefix can
    only be reused up to its first missing chunk): ``block_hits`` counts those
    blocks, ``hit_tokens`` their tokens (capped by the request's prompt).
    """

    policy: str
    capacity_blocks: int
    block_hits: int
    num_reads: int
    hit_tokens: int
    input_tokens: int
    evictions: int
    seconds: float
    regret: Regret | None = None  # evicted blocks asked for again (None for opt)

    @property
    def hit_ratio(self) -> float:
        """Share of block reads served from the cache."""
        return self.block_hits / self.num_reads if self.num_reads else 0.0

    @property
    def token_ratio(self) -> float:
        """Share of prompt tokens whose KV came from the cache."""
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    def saved_seconds(self, prefill_tokens_per_s: float) -> float:
        """Prefill time the reused tokens save at that prefill speed."""
        return self.hit_tokens / prefill_tokens_per_s

    def regret_summary(self) -> dict[str, float | int | None] | None:
        """The regret sample in a few numbers: sampled evicted blocks asked for again (and
        their share), how many accesses and seconds (of the trace's clock) after their
        eviction at the median and the 90th percentile (bucket bounds; None past the
        last), the sampling rate."""
        r = self.regret
        if r is None:
            return None
        quantiles = {
            f"p{round(q * 100)}_{unit}": histogram.quantile(q)
            for unit, histogram in (("accesses", r.accesses), ("seconds", r.seconds))
            for q in (0.5, 0.9)
        }
        return {
            "asked_again": r.seconds.count,
            "unrequested": r.unrequested,
            "share_asked_again": r.share_asked_again,
            **{name: None if math.isinf(v) else v for name, v in quantiles.items()},
            "sampled_one_in": r.sampled_one_in,
        }

    def as_dict(self) -> dict[str, object]:
        fields = {k: v for k, v in asdict(self).items() if k != "regret"}
        return {
            **fields,
            "hit_ratio": self.hit_ratio,
            "token_ratio": self.token_ratio,
            "regret": self.regret_summary(),
        }


def tally(
    trace: Trace,
    policy: str,
    capacity_blocks: int,
    reused: np.ndarray,
    evictions: int,
    seconds: float,
    regret: Regret | None = None,
) -> Outcome:
    """The outcome of a replay in which request ``i`` reused its first ``reused[i]`` blocks."""
    tokens = np.minimum(reused * trace.block_tokens, trace.input_tokens)
    return Outcome(
        policy,
        capacity_blocks,
        int(reused.sum()),
        trace.num_reads,
        int(tokens.sum()),
        int(trace.input_tokens.sum()),
        evictions,
        seconds,
        regret,
    )
