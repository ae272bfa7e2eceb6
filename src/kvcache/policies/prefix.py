"""Prefix: for PrefixCache pools; a chunk goes with its prefix, new chunks wait on probation
whose share adapts, once per returning prompt, to what its evictions cost.

Seven facts about prompt traffic drive it (docs/eviction.md, "Why prefix works"):

- A chunk is reachable only through its parent, so a chunk whose ancestor is
  gone only takes room: the pool keeps the chunk tree (``kvcache.tree``),
  removes a chunk's descendants with it and never stores a chunk whose parent
  is not here.
- Most chunks are read by one request only (three in four in real
  conversation traffic), while shared prefixes (the system prompt, documents)
  are read again and again. As in S3-FIFO, a new chunk waits in a FIFO
  (probation) and leaves it unread unless read there; a read moves it to the
  main queue at once, which keeps the least recently used order (ARC's T2).
  Evicting a chunk from probation evicts the chain of its request below it,
  so one eviction clears a whole unread prompt tail.
- A conversation comes back, if at all, after a gap that is long against a
  small pool and short against a large one: no fixed probation share fits
  every size. As in ARC, the keys evicted lately are remembered as ghosts of
  their queue, and a key put again while a probation ghost grows
  probation's target, while a main ghost shrinks it (by ARC's ratio of the
  two ghost lists, times one entry per ``STEP_ENTRIES`` live ones).
- A returning conversation asks for its whole previous prompt again, so a
  victim's chunks below it join its ghost list with it (they go to main when
  put again); but the target moves once per returning prompt, not once per
  chunk: a chunk recalled under the chunk admitted just before it, from the
  same ghost list, is the same prompt coming back (``Queues.last_admitted``).
  Counted per chunk, long prompts swung the target across the whole pool.
- A chunk nobody read is more likely dead than a read one idle as long, so
  probation's oldest also goes first, whatever the target, when its put is
  older than main's least recently used chunk's last use (``Queues.last_use``,
  the pool's logical clock): a large pool's probation, grown by its target,
  never keeps an unread chunk longer than LRU would.
- A chunk many prompts build on (a system prompt, a quoted document) is worth
  more than a chunk as recently used that only its own conversation reads, and a
  least-recent main queue cannot tell them apart in a small pool. The tree can:
  a chunk with three children put under it or more is shared (two can be one
  conversation going on past its partial last chunk). From its third child on,
  each child put while another child of it is here gives the chunk and the
  chunks above it, which go with it, a credit (``MAX_CREDITS`` at most, kept
  in the ``reads`` word with the child count), and main's least recently used
  chunk, while it holds credits, goes back to main's most recent end with one
  credit less instead of leaving: S3-FIFO's reinsertion, earned by sharing
  instead of by reads, which a conversation's own turns also make.
- What is asked for again and again is worth keeping over what was asked for
  once, even when it was last asked for long ago: the popular documents of a
  small pool come back after the pool has forgotten them, ghosts included. So
  the pool counts every put and hit in a sketch of recent requests
  (``kvcache.sketch``, many pools' worth), and while probation holds its
  target its oldest goes to main instead of leaving when its key was asked for
  more often than main's least recently used chunk, or as often (twice or
  more) from nearer the root (TinyLFU's admission: ``admit_asked``).

Ghosts are at most the live entries (probation's first to go while they
exceed what the target leaves them), so the ring that keeps them stays
amortised O(1) per put (``kvcache.queues``). Each reinsertion spends a credit,
and each step of a credit's walk up gives one (the walk stops at the first
chunk holding ``MAX_CREDITS``), so the two cost what the credits do: a walk is
at most as long as the prompt that reached the shared chunk, whose lookup
passed the same chunks, and usually one step, its ancestors credited already.
An admission to main is O(1) too (four counters per key, and the halving of
all counters once per ``sketch.PERIOD`` counts per entry slot), and each one takes
an entry off probation. Every other step is O(1). Constants: S3-FIFO's 10% to
start, ``STEP_ENTRIES``, ``SHARED_CHILDREN``, ``MAX_CREDITS`` and the sketch's,
chosen on one generated chat trace and one conversation trace and judged on
others and on a real one (docs/eviction.md).
"""

from __future__ import annotations

import numpy as np

from ..errors import corrupt
from ..queues import MAIN, PROBATION, Queues
from .base import Columns, ScoreContext
from .s3fifo import SMALL_SHARE

STEP_ENTRIES = 200
"""A returning prompt moves probation's target by one entry per this many live entries (at
least one, as ARC moves it), so that large pools adapt as fast as small ones."""
MIN_SHARE = 0.01
"""Probation's target never drops below this share of the entries."""
SHARED_CHILDREN = 3
"""A chunk with this many children put under it (ever) is shared by other prompts: two can
be one conversation going on past its partial last chunk."""
MAX_CREDITS = 3
"""The passes of main a shared chunk may skip, as S3-FIFO's 2-bit count."""
CREDIT_MASK, CHILD_SHIFT = 3, 2
"""An entry's ``reads`` word in a ``prefix`` pool: credits in the low two bits, children put
under it (at most ``SHARED_CHILDREN``) above them."""


class Prefix:
    name = "prefix"
    summary = (
        "PrefixCache pools (the default with --prefix-cache): chunks go with their prefix, "
        "new ones on probation whose share adapts"
    )
    fields: tuple[str, ...] = ("probation",)
    tracks_prefixes = True
    uses_queues = True
    counts_requests = True
    recalls_before_evicting = True

    def score(self, columns: Columns, ctx: ScoreContext) -> np.ndarray:
        return (columns["probation"] != 0).astype(np.float64)

    def miss(self, queues: Queues, recalled: int, parent: int) -> None:
        """A key not held is about to be put: move probation's target by its ghost, once per
        returning prompt (the key has left its ghost list already, so it is counted back)."""
        if recalled < 0 or queues.last_admitted == (parent, recalled):
            return  # no ghost, or a chunk of a prompt whose return moved the target already
        ghosts, c = queues.ghosts, queues.num_live
        b1, b2 = ghosts.count(PROBATION), ghosts.count(MAIN)
        if recalled == PROBATION:
            queues.target = min(c, target(queues) + step(queues) * max(b2 / (b1 + 1), 1.0))
        else:
            queues.target = max(
                MIN_SHARE * c, target(queues) - step(queues) * max(b1 / (b2 + 1), 1.0)
            )

    def admit(self, queues: Queues, eid: int, recalled: int) -> None:
        """Queue a new entry: main if its key was a ghost, else probation. Count it as a child
        of its parent; from the parent's third child on, credit the parent and the chunks
        above it (``share``)."""
        queues.set_reads(eid, 0)
        queues.lists.push(eid, MAIN if recalled >= 0 else PROBATION)
        queues.last_admitted = (eid, recalled)
        queues.count_request(eid)
        parent = queues.parent(eid)
        if parent >= 0:
            share(queues, parent)

    def hit(self, queues: Queues, eid: int) -> None:
        """A read: to main's most recent end, from probation or within main; counted."""
        queues.lists.move(eid, MAIN)
        queues.count_request(eid)

    def victim(self, queues: Queues, recalled: int) -> int:
        """The entry to evict now (the pool is full): probation's oldest while probation holds
        its target (or main is empty), or while it is older than main's least recently used
        (an unread chunk never outlives the chunks read before it), else main's least
        recently used. It and the chunks below it become ghosts of its list. First, while
        probation holds its target, its oldest goes to main instead when it was asked for
        more than main's least recently used (``admit_asked``)."""
        holds = max(1.0, target(queues))  # what probation holds at its target
        admit_asked(queues, holds)
        on_probation = queues.num_probation
        kind = MAIN
        if (on_probation and on_probation >= holds) or not queues.num_main:
            kind = PROBATION
        victim = queues.lists.tail(kind) if kind == PROBATION else least_recent(queues)
        if victim >= 0 and kind == MAIN and on_probation:
            oldest = queues.lists.tail(PROBATION)
            if oldest >= 0 and queues.last_use(oldest) <= queues.last_use(victim):
                kind, victim = PROBATION, oldest
        if victim < 0:
            raise corrupt("queue lists: a list the counts say holds entries is empty")
        return remember(queues, victim, kind)


def admit_asked(queues: Queues, holds: float) -> None:
    """TinyLFU's admission: while probation holds its target (``holds`` entries), move its
    oldest to main's most recent end if it was asked for more than main's least recently
    used (``asked_more``), as a read would have. A chunk that documents or system prompts
    of other prompts reach again and again stays, where the chunks that one conversation
    asked for once go first. Each move takes an entry off probation, so the loop ends;
    main's least recently used stays the same through it (a move lands at main's other
    end), so it is asked once."""
    lists = queues.lists
    least = lists.tail(MAIN) if queues.num_main else -1
    if least < 0:
        return  # nothing in main (a damaged list is victim's to report)
    others, depth = queues.asked(least), queues.depth(least)
    while queues.num_probation >= holds:
        oldest = lists.tail(PROBATION)
        if oldest < 0 or not asked_more(queues, oldest, others, depth):
            return
        lists.move(oldest, MAIN)


def asked_more(queues: Queues, chunk: int, others: int, depth: int) -> bool:
    """Whether ``chunk``'s key was asked for more often lately than ``others`` times
    (``kvcache.sketch``), or as often, at least twice, from nearer the root than ``depth``:
    a chunk fewer chunks deep is a prefix of at least as many prompts as one deeper."""
    asked = queues.asked(chunk)
    return asked > others or (asked == others >= 2 and queues.depth(chunk) < depth)


def share(queues: Queues, parent: int) -> None:
    """A chunk was put under ``parent``: count it (at most ``SHARED_CHILDREN``); if
    ``parent`` has had that many children or more and holds another now, give it and the
    chunks above it a credit each, up to the first that holds ``MAX_CREDITS`` (its
    ancestors were credited with it). A chunk whose other children all left is not shared
    now: crediting it kept chunks no longer read in large pools (the real trace at 20%).
    The walk passes only chunks the new chunk's prompt reached through, each credited, so
    it costs what the credits it gives and the reads that led to it cost."""
    word = queues.reads(parent)
    children = min((word >> CHILD_SHIFT) + 1, SHARED_CHILDREN)
    queues.set_reads(parent, (children << CHILD_SHIFT) | (word & CREDIT_MASK))
    if children < SHARED_CHILDREN or not queues.has_two_children(parent):
        return  # not shared, or shared once: no other prompt builds on it now
    steps = queues.num_live + 1  # a longer walk is a cycle in damaged links
    while parent >= 0 and (word := queues.reads(parent)) & CREDIT_MASK < MAX_CREDITS:
        if (steps := steps - 1) < 0:
            raise corrupt("chunk tree: a walk to the root does not end")
        queues.set_reads(parent, word + 1)
        parent = queues.parent(parent)


def least_recent(queues: Queues) -> int:
    """Main's least recently used entry without credits: each one with credits in the way
    goes back to main's most recent end, one credit less (a shared chunk's extra pass).

    Raises:
        CorruptPoolError: more moves than the entries' credits allow (damaged lists).
    """
    lists, moves = queues.lists, (MAX_CREDITS + 1) * (queues.num_live + 1)
    while (least := lists.tail(MAIN)) >= 0 and (moves := moves - 1) > 0:
        word = queues.reads(least)
        if not word & CREDIT_MASK:
            return least
        queues.set_reads(least, word - 1)
        lists.move(least, MAIN)
    if least < 0:
        return least
    raise corrupt("queue lists: no entry to evict, or a credit count out of range")


def remember(queues: Queues, victim: int, kind: int) -> int:
    """Make ``victim`` and the chunks below it, which go with it, ghosts of its queue."""
    for each in (*queues.descendants(victim), victim):
        queues.ghosts.add(queues.key_hash(each), kind)
    trim(queues)
    return victim


def step(queues: Queues) -> float:
    """How far one returning prompt moves probation's target, before ARC's ratio."""
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
