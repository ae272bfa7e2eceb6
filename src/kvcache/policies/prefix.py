"""Prefix: for PrefixCache pools; a chunk goes with its prefix, new chunks wait on probation
whose share adapts to what its evictions cost.

Four facts about prompt traffic drive it (docs/eviction.md, "Why prefix works"):

- A chunk is reachable only through its parent, so a chunk whose ancestor is
  gone only takes room: the pool keeps the chunk tree (``kvcache.tree``),
  removes a chunk's descendants with it and never stores a chunk whose parent
  is not here.
- Most chunks are read by one request only (three in four in real
  conversation traffic), while shared prefixes (the system prompt, documents)
  are read again and again. As in S3-FIFO, a new chunk waits in a small FIFO
  (probation) and moves to the main queue only if it is read there; the main
  queue is a FIFO with reinsertion (a 2-bit read count). Evicting a chunk
  from probation evicts the chain of its request below it, so one eviction
  clears a whole unread prompt tail.
- A conversation comes back, if at all, after a gap that is long against a
  small pool and short against a large one: no fixed probation share fits
  every size. As in ARC, the keys evicted lately are remembered as ghosts of
  their queue, and a key put again while a probation ghost grows
  probation's target, while a main ghost shrinks it (by ARC's ratio of the
  two ghost lists, times one entry per ``STEP_ENTRIES`` live ones). Small
  pools settle near S3-FIFO's 10%, large ones near a FIFO of everything,
  which is how LRU wins there.
- A returning conversation asks for its whole previous prompt again, so a
  victim's chunks below it join its ghost list with it: a ghost hit counts
  once per chunk, for either queue alike.

Ghosts are at most the live entries (probation's first to go while they
exceed what the target leaves them), so the ring that keeps them stays
amortised O(1) per put (``kvcache.queues``). Constants: S3-FIFO's (10% to
start, 2-bit counts) and ``STEP_ENTRIES``, chosen on one generated chat trace
and judged on others and on a real one (docs/eviction.md).
"""

from __future__ import annotations

import numpy as np

from ..errors import corrupt
from ..queues import MAIN, PROBATION, Queues
from .base import Columns, ScoreContext
from .s3fifo import MAX_READS, SMALL_SHARE

STEP_ENTRIES = 2000
"""One ghost hit moves probation's target by one entry per this many live entries (at
least one, as ARC moves it), so that large pools adapt as fast as small ones."""
MIN_SHARE = 0.01
"""Probation's target never drops below this share of the entries."""


class Prefix:
    name = "prefix"
    summary = (
        "PrefixCache pools (the default with --prefix-cache): chunks go with their prefix, "
        "new ones on probation whose share adapts"
    )
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = True
    uses_queues = True
    recalls_before_evicting = True

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return (columns["probation"] != 0).astype(np.float64)

    def miss(self, queues: Queues, recalled: int) -> None:
        """A key not held is about to be put: move probation's target by its ghost (the key
        has left its ghost list already, so it is counted back)."""
        ghosts, c = queues.ghosts, queues.num_live
        b1, b2 = ghosts.count(PROBATION), ghosts.count(MAIN)
        if recalled == PROBATION:
            queues.target = min(c, target(queues) + step(queues) * max(b2 / (b1 + 1), 1.0))
        elif recalled == MAIN:
            queues.target = max(
                MIN_SHARE * c, target(queues) - step(queues) * max(b1 / (b2 + 1), 1.0)
            )

    def admit(self, queues: Queues, eid: int, recalled: int) -> None:
        """Queue a new entry: main if its key was a ghost, else probation."""
        queues.set_reads(eid, 0)
        queues.lists.push(eid, MAIN if recalled >= 0 else PROBATION)

    def hit(self, queues: Queues, eid: int) -> None:
        queues.set_reads(eid, min(queues.reads(eid) + 1, MAX_READS))

    def victim(self, queues: Queues, recalled: int) -> int:
        """The entry to evict now (the pool is full), after the moves that find it; it and,
        from probation, the chunks below it become ghosts."""
        lists = queues.lists
        # Each move undoes a read (at most MAX_READS per entry): more moves than that
        # means damaged lists (a loop), which must raise rather than spin under the lock.
        moves = (MAX_READS + 1) * (queues.num_live + 1)
        if (queues.num_probation and queues.num_probation >= max(1.0, target(queues))) or (
            not queues.num_main
        ):
            while (oldest := lists.tail(PROBATION)) >= 0 and (moves := moves - 1) > 0:
                if not queues.reads(oldest):
                    return remember(queues, oldest, PROBATION)
                queues.set_reads(oldest, 0)  # read while on probation: to main
                lists.move(oldest, MAIN)
        while (oldest := lists.tail(MAIN)) >= 0 and (moves := moves - 1) > 0:
            reads = queues.reads(oldest)
            if not reads:
                return remember(queues, oldest, MAIN)
            queues.set_reads(oldest, reads - 1)
            lists.move(oldest, MAIN)
        raise corrupt("queue lists: no entry to evict, or a list that loops")


def remember(queues: Queues, victim: int, kind: int) -> int:
    """Make ``victim`` and the chunks below it, which go with it, ghosts of its queue."""
    for each in (*queues.descendants(victim), victim):
        queues.ghosts.add(queues.key_hash(each), kind)
    trim(queues)
    return victim


def step(queues: Queues) -> float:
    """How far one ghost hit moves probation's target, before ARC's ratio."""
    return max(1.0, queues.num_live / STEP_ENTRIES)


def target(queues: Queues) -> float:
    """Probation's target in entries: S3-FIFO's share until a ghost first moved it."""
    return queues.target or SMALL_SHARE * queues.num_live


def trim(queues: Queues) -> None:
    """Keep the ghosts at most the live entries: probation's go first while they exceed
    what the target leaves them."""
    ghosts, c = queues.ghosts, queues.num_live
    while ghosts.count(PROBATION) + ghosts.count(MAIN) > c:
        b1 = ghosts.count(PROBATION)
        probation_first = b1 > c - target(queues) or not ghosts.count(MAIN)
        ghosts.drop_oldest(PROBATION if b1 and probation_first else MAIN)
