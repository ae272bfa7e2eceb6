"""Eviction policies, by name.

Each policy is a small module that scores entries (``base.Policy``); ranking,
expiry-first and tie-breaking are shared in ``base``. The pool asks
``choose_victims`` for candidates and frees them itself: policies never touch
memory. Pools with more live entries than their ``eviction_samples`` score a
random sample per eviction (as Redis does), so the cost of a put does not grow
with the pool; smaller pools, and explicit ``Pool.evict``, rank every entry.

A policy may ask the pool for more, kept in the segment: ``tracks_prefixes``
(the chunk tree of ``kvcache.tree``: ``prefix``), ``uses_queues`` (exact
queues and ghosts, ``kvcache.queues``, for policies defined by queues:
``s3fifo``, ``arc``, ``prefix``; they choose victims themselves, in O(1),
without sampling).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InvalidArgument
from .arc import ARC
from .base import RANKING_FIELDS, Policy, QueuePolicy, ScoreContext, rank_victims
from .fifo import FIFO
from .lfu import LFU
from .lru import LRU
from .prefix import Prefix
from .priority import Priority
from .s3fifo import S3FIFO
from .size import Size
from .ttl import TTL

EVICTION_BATCH = 16
"""Victims taken from one ranked sample in pools too large to rank whole (see
choose_victims). Measured on 4 KiB puts into a full 4096-entry pool: 65 us per
put evicting 1 of 64 draws, 22 us with batches of 8, 21 us with 16; the
trace-replay hit rate is unchanged (the best 16 of 1024 draws are as good
victims as the best 1 of 64)."""

POLICIES: dict[str, Policy] = {
    p.name: p for p in (LRU(), LFU(), FIFO(), Priority(), TTL(), Size(), S3FIFO(), ARC(), Prefix())
}


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


def sample_batch(num_live: int, num_samples: int) -> int:
    """The victims one ranked sample gives (``choose_victims``), ``num_samples`` draws
    each; 0 where the pool is small enough to rank every entry."""
    return 0 if num_live <= num_samples else min(EVICTION_BATCH, num_live // num_samples)


def choose_victims(
    policy: Policy,
    table: np.ndarray,
    live_ids: np.ndarray,
    ctx: ScoreContext,
    num_samples: int,
    rng: np.random.Generator,
    rank: Callable[[np.ndarray, int, float], list[int] | None] | None = None,
    draw: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> tuple[np.ndarray, bool]:
    """Entry ids to evict, best first, and whether the ranking was exact.

    With at most ``num_samples`` live entries all are ranked (exact: evict
    from the front until there is room). Otherwise ``num_samples`` ids are
    drawn per victim wanted and only the best of each such share are returned
    (a batch of up to ``EVICTION_BATCH``): the best 16 of 1024 draws are as good
    victims as the best 1 of 64, and one numpy pass serves 16 evictions. The
    caller evicts the whole batch, a little ahead of need: a batch is at most one
    victim per ``num_samples`` live entries, so never more than 1/64 of the pool
    (the default) goes early, in a pool of 200 entries as in one of 200,000.

    Args:
        table: the whole entry table (structured view).
        live_ids: ids of READY entries.
        num_samples: draws per victim.
        rank: ``rank(ids, top, now_s)``, the sample's best ``top`` places, compiled
            (``kvcache._lookup``'s ``rank``), or None where it leaves the ranking to numpy.
        draw: ``draw(live_ids, words, ids)``, numpy's ``live_ids[words % live_ids.size]``
            compiled (``kvcache.native.draw``), or None.
    """
    batch = sample_batch(live_ids.size, num_samples)
    if not batch:
        return live_ids[rank_victims(policy, table[live_ids], ctx)], True
    # Duplicate draws are harmless: the caller skips ids it already evicted. Raw words
    # modulo the live count (biased by at most live / 2**64) cost a third of rng.integers.
    words = rng.bit_generator.random_raw(num_samples * batch)
    if draw is None:
        ids = live_ids[words % np.uint64(live_ids.size)]
    else:
        ids = np.empty(words.size, np.int64)
        draw(live_ids, words, ids)
    if rank is not None and ids.size > batch:  # numpy's cut at the top, which C follows
        places = rank(ids, batch, ctx.now_s)
        if places is not None:
            return ids[places], False
    columns = {name: table[name][ids] for name in (*RANKING_FIELDS, *policy.fields)}
    return ids[rank_victims(policy, columns, ctx, top=batch)], False


__all__ = [
    "EVICTION_BATCH",
    "POLICIES",
    "Policy",
    "QueuePolicy",
    "ScoreContext",
    "choose_victims",
    "get_policy",
    "rank_victims",
    "sample_batch",
]
