"""The policy interface and the victim ranking every policy shares.

A policy only scores candidate entries, all on one scale: higher is a better
victim (as Redis does). Everything else is shared here: expired entries rank
first under every policy, ties go to the least recently used, and the pool
does the freeing. Scores are computed with numpy over a batch of candidates,
never with a Python loop per entry; a policy names the entry fields it reads
so that only those columns are gathered for a sample (gathering whole
160-byte records cost ~10 us of a ~50 us eviction).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..queues import Queues


@dataclass(frozen=True)
class ScoreContext:
    """What a score may depend on besides the records."""

    clock: int  # the pool's logical clock (one tick per put and per hit)
    now_s: float  # wall-clock seconds, for expiry
    lfu_half_life: int  # clock ticks after which an idle LFU count halves
    num_live: int = 0  # READY entries
    num_probation: int = 0  # of them, on probation (policies that use it)
    probation_target: float = 0.0  # how many probation may hold before it goes first (``arc``)


Columns = Mapping[str, np.ndarray] | np.ndarray
"""Entry fields by name (``layout.ENTRY_DTYPE``), one array each; a structured array also fits."""
RANKING_FIELDS = ("expires_at", "last_access")
"""Fields every ranking reads besides the policy's own."""


class Policy(Protocol):
    """An eviction policy: a name, a one-line use case, the fields it reads, a vectorised score.

    ``tracks_prefixes``: the pool keeps the chunk tree (``kvcache.tree``) for
    it. ``uses_queues``: the policy is a ``QueuePolicy`` and the pool keeps its
    queues (``kvcache.queues``), run exactly rather than scored on samples.
    ``counts_requests``: the pool counts requests for it (``kvcache.sketch``).
    """

    name: str
    summary: str
    fields: tuple[str, ...]
    tracks_prefixes: bool
    uses_queues: bool
    counts_requests: bool

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        """Victim score per entry; higher is evicted first."""
        ...


class QueuePolicy(Policy, Protocol):
    """A policy defined by queues (``s3fifo``, ``arc``), run exactly on the pool's ``Queues``.

    The pool calls ``miss`` before it stores a key it does not hold (``recalled``:
    the kind of the key's ghost, which the pool has forgotten, or -1; ``parent``: the
    entry of the chunk it extends, in a prefix-tracking pool, else -1), ``victim``
    each time it must evict (with the same ``recalled``), ``admit`` once the new
    entry is stored, and ``hit`` on each read and on a put of a key it holds.
    Explicit ``Pool.evict`` still ranks by ``score``.

    ``recalls_before_evicting``: the pool looks up the new key's ghost before it
    evicts for it (ARC: the ghost decides the victim); otherwise after (S3-FIFO:
    the evictions may push that ghost out), and ``miss`` and ``victim`` get -1.
    """

    recalls_before_evicting: bool

    def miss(self, queues: Queues, recalled: int, parent: int) -> None: ...

    def victim(self, queues: Queues, recalled: int) -> int:
        """The entry to evict now; it may move others first and remember it as a ghost."""
        ...

    def admit(self, queues: Queues, eid: int, recalled: int) -> None: ...

    def hit(self, queues: Queues, eid: int) -> None: ...


def decayed_frequency(columns: Columns, ctx: ScoreContext) -> np.ndarray:
    """Access counts aged to ``ctx.clock``: halved every ``lfu_half_life`` idle ticks."""
    idle = ctx.clock - columns["last_access"]
    return columns["freq"] * np.exp2(-idle / ctx.lfu_half_life)


def rank_victims(
    policy: Policy, columns: Columns, ctx: ScoreContext, top: int | None = None
) -> np.ndarray:
    """Order entries best victim first: expired, then by score, then least recent.

    Args:
        top: only the best ``top`` are wanted: a partial sort finds the score
            at the cut, and only entries at least that good (ties included, so
            recency still breaks them) are sorted.
    """
    key = -np.asarray(policy.score(columns, ctx), dtype=np.float64)
    key = np.where(columns["expires_at"] <= ctx.now_s, -np.inf, key)
    if top is not None and top < key.size:
        cut = np.partition(key, top - 1)[top - 1]
        best = np.flatnonzero(key <= cut)
        return best[np.lexsort((columns["last_access"][best], key[best]))][:top]
    return np.lexsort((columns["last_access"], key))
