"""S3-FIFO (Yang et al., SOSP'23): a small FIFO queue in front of a main one, and a ghost.

Most cached objects are read once ("one-hit wonders"). S3-FIFO puts a new
entry in a small FIFO queue (here: probation) that holds ``SMALL_SHARE`` of the
entries; when the small queue is at its share, its oldest entry leaves: to the
main queue if it was read meanwhile, else out of the pool, its key kept in a
ghost FIFO as long as the main queue's share. A key put again while in the
ghost skips the small queue. The main queue is a FIFO with reinsertion: its
oldest entry, if read since it was queued (a 2-bit count, at most 3), goes
back to the head with one read less, else it is evicted.

We run it exactly, on the segment's queues (``kvcache.queues``): each step is
O(1), and the reinsertions per eviction are O(1) amortised (each undoes one
read). The pool's capacity is taken as its live entries when it evicts (the
pool is full then). ``score`` serves only explicit ``Pool.evict``, which ranks
every entry at once: probation first, then least recently used.
"""

from __future__ import annotations

import numpy as np

from ..errors import corrupt
from ..queues import MAIN, PROBATION, Queues
from .base import Columns, ScoreContext

SMALL_SHARE = 0.1
"""The small queue's share of the entries (the paper's 10%)."""
MAX_READS = 3
"""The main queue's 2-bit read count."""


class S3FIFO:
    name = "s3fifo"
    summary = "new entries on probation first (small FIFO + main + ghost); keys mostly read once"
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = False
    uses_queues = True
    counts_requests = False
    recalls_before_evicting = False

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return (columns["probation"] != 0).astype(np.float64)

    def admit(self, queues: Queues, eid: int, recalled: int) -> None:
        """Queue a new entry: in main if its key was a ghost (``recalled`` >= 0), else small."""
        queues.set_reads(eid, 0)
        queues.lists.push(eid, MAIN if recalled >= 0 else PROBATION)

    def miss(self, queues: Queues, recalled: int, parent: int) -> None:
        """A key not held is about to be put: nothing to adapt (S3-FIFO's shares are fixed)."""

    def hit(self, queues: Queues, eid: int) -> None:
        queues.set_reads(eid, min(queues.reads(eid) + 1, MAX_READS))

    def victim(self, queues: Queues, recalled: int) -> int:
        """The entry to evict now (the pool is full), after the moves that find it.

        Raises:
            CorruptPoolError: more moves than the entries' reads allow (a read count out
                of range, or lists that loop): damage, which must not spin under the lock.
        """
        capacity = queues.num_probation + queues.num_main
        small = max(1, int(capacity * SMALL_SHARE))
        lists = queues.lists
        moves = (MAX_READS + 1) * (queues.num_live + 1)  # each move undoes a read
        if queues.num_probation >= small or not queues.num_main:
            while (oldest := lists.tail(PROBATION)) >= 0 and (moves := moves - 1) > 0:
                if not queues.reads(oldest):
                    queues.ghosts.add(queues.key_hash(oldest), PROBATION)
                    while queues.ghosts.count(PROBATION) > capacity - small:
                        queues.ghosts.drop_oldest(PROBATION)
                    return oldest
                queues.set_reads(oldest, 0)  # read while small: to main, its count cleared
                lists.move(oldest, MAIN)
        while (oldest := lists.tail(MAIN)) >= 0 and (moves := moves - 1) > 0:
            reads = queues.reads(oldest)
            if not reads:
                return oldest
            queues.set_reads(oldest, reads - 1)
            lists.move(oldest, MAIN)
        raise corrupt("queue lists: no entry to evict, or a read count out of range")
