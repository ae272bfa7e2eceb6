"""Eviction policies, by name.

Each policy is a small module that scores entries (``base.Policy``); ranking,
expiry-first and tie-breaking are shared in ``base``. The pool asks
``choose_victims`` for candidates and frees them itself: policies never touch
memory. Pools with more live entries than their ``eviction_samples`` score a
random sample per eviction (as Redis does), so the cost of a put does not grow
with the pool; smaller pools, and explicit ``Pool.evict``, rank every entry.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from .base import Policy, ScoreContext, rank_victims
from .fifo import FIFO
from .lfu import LFU
from .lru import LRU
from .priority import Priority
from .size import Size
from .ttl import TTL

POLICIES: dict[str, Policy] = {p.name: p for p in (LRU(), LFU(), FIFO(), Priority(), TTL(), Size())}


def get_policy(name: str) -> Policy:
    """The policy called ``name``.

    Raises:
        InvalidArgument: unknown name; the message lists the valid ones.
    """
    try:
        return POLICIES[name]
    except (KeyError, TypeError):
        raise InvalidArgument(
            f"unknown eviction policy {name!r}: choose one of {', '.join(POLICIES)}"
        ) from None


def choose_victims(
    policy: Policy,
    records: np.ndarray,
    live_ids: np.ndarray,
    ctx: ScoreContext,
    num_samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Entry ids to evict, best first: all live ids ranked, or a ranked random sample.

    Args:
        records: the whole entry table (structured view).
        live_ids: ids of READY entries.
        num_samples: rank at most this many (uniformly sampled) ids.
    """
    if live_ids.size > num_samples:
        live_ids = np.unique(live_ids[rng.integers(0, live_ids.size, num_samples)])
    return live_ids[rank_victims(policy, records[live_ids], ctx)]


__all__ = ["POLICIES", "Policy", "ScoreContext", "choose_victims", "get_policy", "rank_victims"]
