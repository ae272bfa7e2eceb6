"""ARC (Megiddo and Modha, FAST'03): recency and frequency, balanced by what was evicted.

ARC keeps two LRU lists, entries seen once (T1: here, probation) and entries
seen again (T2: main), two ghost lists of the keys each evicted lately (B1,
B2), and a target size p for T1. A hit moves an entry to T2's most recent end.
A miss on a key in B1 means T1 was too small: p grows by max(1, |B2|/|B1|); a
miss in B2 shrinks it by max(1, |B1|/|B2|); the key then joins T2. Otherwise
the key joins T1, and the ghosts are trimmed so that T1 and B1 hold at most c
keys and all four lists 2c (the paper's case IV). To make room ARC evicts T1's
least recent entry while T1 holds more than p entries (or exactly p, when the
key came from B2), else T2's, remembering it in the list's ghost.

We run it exactly, on the segment's queues (``kvcache.queues``), with c the
pool's live entries (its capacity in entries once it is full, whatever the
values' sizes; the entry slots would let the ghosts outgrow the cache many
times over when values take many pages); p is the header's
``probation_target``. Every step is O(1). ``score`` serves
only explicit ``Pool.evict``, which ranks every entry at once.
"""

from __future__ import annotations

import numpy as np

from ..queues import MAIN, PROBATION, Queues
from .base import Columns, ScoreContext


class ARC:
    name = "arc"
    summary = "balances recency and frequency by its evictions' ghosts; when the reuse mix shifts"
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = False
    uses_queues = True
    counts_requests = False
    recalls_before_evicting = True

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        on_probation = columns["probation"] != 0
        probation_first = ctx.num_probation > ctx.probation_target
        return (on_probation == probation_first).astype(np.float64)

    def miss(self, queues: Queues, recalled: int, parent: int) -> None:
        """A key not held is about to be put: adapt p to a ghost of kind ``recalled``
        (cases II and III; the key has left its ghost list already, so it is counted
        back), else trim the ghosts (case IV)."""
        ghosts, c = queues.ghosts, queues.num_live
        b1, b2 = ghosts.count(PROBATION), ghosts.count(MAIN)
        if recalled == PROBATION:
            queues.target = min(c, queues.target + max(b2 / (b1 + 1), 1.0))
        elif recalled == MAIN:
            queues.target = max(0.0, queues.target - max(b1 / (b2 + 1), 1.0))
        elif queues.num_probation + b1 >= c:
            if queues.num_probation < c:
                ghosts.drop_oldest(PROBATION)
        elif queues.num_probation + b1 + queues.num_main + b2 >= 2 * c:
            ghosts.drop_oldest(MAIN)

    def admit(self, queues: Queues, eid: int, recalled: int) -> None:
        """Queue a new entry: T2 if its key was a ghost, else T1 (the ghosts trimmed). Its
        ``reads`` word held the pool's note of when to look up the ghost: cleared."""
        queues.set_reads(eid, 0)
        queues.lists.push(eid, MAIN if recalled >= 0 else PROBATION)

    def hit(self, queues: Queues, eid: int) -> None:
        queues.lists.move(eid, MAIN)

    def victim(self, queues: Queues, recalled: int) -> int:
        """The entry to evict now (the pool is full): REPLACE, or case IV's T1 eviction."""
        lists, ghosts, t1 = queues.lists, queues.ghosts, queues.num_probation
        if recalled < 0 and t1 >= queues.num_live:
            return lists.tail(PROBATION)  # T1 is the whole cache: no ghost
        p = queues.target
        if t1 and (t1 > p or (recalled == MAIN and t1 == p) or not queues.num_main):
            victim, kind = lists.tail(PROBATION), PROBATION
        else:
            victim, kind = lists.tail(MAIN), MAIN
        ghosts.add(queues.key_hash(victim), kind)
        return victim
