"""Exact, plain-Python models of the classic policies, as their papers define them.

The engine's ``s3fifo`` and ``arc`` are judged against these: same
trace, same capacity, block hit ratio within 0.3 points. Each model holds at
most ``capacity`` keys of equal size and answers the two calls a prompt replay
makes: ``get`` (a read: hit or miss) and ``put`` (store a key; storing a key
held already is a read of it, as a request for it would be).

- ``ExactS3FIFO``: Yang et al., SOSP'23, as libCacheSim's S3FIFO.c runs it: a
  small FIFO (10% of the capacity) for new keys, a main FIFO with 2-bit
  reinsertion (CLOCK with counts up to 3), and a ghost FIFO of keys the small
  queue evicted unread, as long as the main queue's share (90%). A key read
  while in the small queue moves to main when it reaches the small queue's
  tail; a key put while in the ghost goes straight to main.
- ``ExactARC``: Megiddo and Modha, FAST'03, Fig. 4 (cases I-IV, REPLACE).
- ``ExactLRU``: for completeness and as a sanity baseline.
- ``PrefixModel``: the ``prefix`` policy written plainly, over the chunk tree
  (``replay`` puts each block under the one before it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvcache.keys import key_hash

SMALL_SHARE = 0.1
SHARED_CHILDREN = 3  # PrefixModel: children put under a chunk from which it counts as shared
MAX_CREDITS = 3  # PrefixModel: the passes of main a shared chunk may skip
SKETCH_PER_ENTRY = 16  # PrefixModel: counters per entry slot in its request counts
SKETCH_LIMIT = 15  # the largest count
SKETCH_PERIOD = 40  # counts per entry slot between halvings
KEY_BYTES = 8  # a block's key as the replay writes it: its id, 8 bytes little-endian


class ExactLRU:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: OrderedDict[Hashable, None] = OrderedDict()

    def get(self, key: Hashable) -> bool:
        if key in self.keys:
            self.keys.move_to_end(key)
            return True
        return False

    def put(self, key: Hashable) -> None:
        if self.get(key):
            return
        if len(self.keys) >= self.capacity:
            self.keys.popitem(last=False)
        self.keys[key] = None


class ExactS3FIFO:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.small_capacity = max(1, int(capacity * SMALL_SHARE))
        self.ghost_capacity = capacity - self.small_capacity
        self.small: OrderedDict[Hashable, None] = OrderedDict()  # oldest first
        self.main: OrderedDict[Hashable, None] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.freq: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def get(self, key: Hashable) -> bool:
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, 3)
            return True
        return False

    def put(self, key: Hashable) -> None:
        if self.get(key):
            return
        while len(self) >= self.capacity:
            self._evict()
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0

    def _evict(self) -> None:
        if len(self.small) >= self.small_capacity or not self.main:
            self._evict_small()
        else:
            self._evict_main()

    def _evict_small(self) -> None:
        while self.small:
            key, _ = self.small.popitem(last=False)
            if self.freq[key] > 0:  # read while small: to main, its count cleared
                self.freq[key] = 0
                self.main[key] = None
                continue
            del self.freq[key]
            self.ghost[key] = None
            if len(self.ghost) > self.ghost_capacity:
                self.ghost.popitem(last=False)
            return

    def _evict_main(self) -> None:
        while self.main:
            key, _ = self.main.popitem(last=False)
            if self.freq[key] > 0:
                self.freq[key] -= 1
                self.main[key] = None
                continue
            del self.freq[key]
            return


class ExactARC:
    def __init__(self, capacity: int) -> None:
        self.c = capacity
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()  # LRU first
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def get(self, key: Hashable) -> bool:
        """Case I: a hit in T1 or T2 moves the key to T2's MRU end."""
        return read_to_recent(key, self.t1, self.t2)

    def put(self, key: Hashable) -> None:
        """Cases II-IV: a miss, the key then stored (a key held already: case I)."""
        if self.get(key):
            return
        if key in self.b1:  # II: T1 was too small
            self.p = min(self.c, self.p + max(len(self.b2) / len(self.b1), 1))
            self._replace(in_b2=False)
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:  # III: T2 was too small
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1))
            self._replace(in_b2=True)
            del self.b2[key]
            self.t2[key] = None
        else:  # IV
            l1 = len(self.t1) + len(self.b1)
            if l1 == self.c:
                if len(self.t1) < self.c:
                    self.b1.popitem(last=False)
                    self._replace(in_b2=False)
                else:
                    self.t1.popitem(last=False)
            elif l1 < self.c:
                total = l1 + len(self.t2) + len(self.b2)
                if total >= self.c:
                    if total == 2 * self.c:
                        self.b2.popitem(last=False)
                    self._replace(in_b2=False)
            self.t1[key] = None

    def _replace(self, in_b2: bool) -> None:
        if len(self.t1) + len(self.t2) < self.c:
            return  # not full yet: nothing to evict (the paper's cache is full here)
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)):
            key, _ = self.t1.popitem(last=False)
            self.b1[key] = None
        else:
            key, _ = self.t2.popitem(last=False)
            self.b2[key] = None


class PrefixModel:
    """``policies/prefix.py`` written plainly: a chunk is stored only under a chunk held and
    goes with the chunks below it; a FIFO probation and an LRU main queue (a read moves a
    key to main), ARC's two ghost lists (a victim's chunks below it join its ghost list
    too, at most the live keys in all) and a probation target moved by a returning
    prompt's first recalled chunk, ``max(1, live / 200)`` keys times ARC's ratio, from 10%
    of the live keys, within 1-100%; probation's oldest also goes first when it is older
    than main's least recently used (by a logical clock of puts and hits, as the pool's).
    A chunk that has had three children put under it or more is shared: each further child
    put while another child of it is here gives it and its ancestors a credit (at most 3;
    the walk up stops at a chunk holding 3),
    and main's least recently used, while it holds credits, goes back to main's most recent
    end with one credit less instead of leaving. Every put stored and every hit is counted
    in a count-min sketch of 4-bit counts (``SKETCH_PER_ENTRY`` one-byte counters per
    entry slot, four of them per key, at the bits of the key's hash the pool uses; only
    the smallest of the four go up; all halve every ``SKETCH_PERIOD`` counts per slot),
    and while probation holds its target, its oldest goes to main instead of leaving
    when it was asked for more often than main's least recently used, or as often (twice
    or more) from fewer chunks deep (TinyLFU's admission, ties to the shallower). As the
    pool does, it takes its capacity in
    the policy's arithmetic as the keys it holds (``live``), and walks a victim's chunks
    newest child first, so that the two make the same decisions step for step."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.p = 0.0  # ARC's p, once a ghost moved it (0: not yet)
        self.small: OrderedDict[Hashable, None] = OrderedDict()  # oldest first
        self.main: OrderedDict[Hashable, None] = OrderedDict()  # least recent first
        self.ghosts: dict[str, OrderedDict[Hashable, None]] = {
            "small": OrderedDict(),
            "main": OrderedDict(),
        }
        self.children: dict[Hashable, list[Hashable]] = {}  # newest first
        self.parent: dict[Hashable, Hashable | None] = {}
        self.last: tuple[Hashable, str | None] | None = None  # the last put and its ghost
        self.clock = 0  # one tick per hit and per put stored
        self.used: dict[Hashable, int] = {}  # each key's last put or hit
        self.num_children: dict[Hashable, int] = {}  # children ever put under the key, <= 3
        self.credits: dict[Hashable, int] = {}  # passes of main the key may still skip
        width = 1 << (SKETCH_PER_ENTRY * capacity - 1).bit_length()
        self.counts = bytearray(width)  # the request counts: a count-min sketch
        self.mask, self.counted = width - 1, 0
        self.depth: dict[Hashable, int] = {}  # the chunks above each key

    def live(self) -> int:
        return len(self.small) + len(self.main)

    def target(self) -> float:
        return self.p or SMALL_SHARE * self.live()

    def get(self, key: Hashable) -> bool:
        """A read moves the key to main's most recent end, as ARC's case I."""
        if not read_to_recent(key, self.small, self.main):
            return False
        self.clock += 1
        self.used[key] = self.clock
        self._count(key)
        return True

    def _spots(self, key: Hashable) -> list[int]:
        assert isinstance(key, int)
        lo, hi = key_hash(key.to_bytes(KEY_BYTES, "little"))
        return [lo & self.mask, lo >> 32 & self.mask, hi & self.mask, hi >> 32 & self.mask]

    def asked(self, key: Hashable) -> int:
        """How often ``key`` was asked for lately (the smallest of its counters)."""
        return min(self.counts[spot] for spot in self._spots(key))

    def _count(self, key: Hashable) -> None:
        spots = self._spots(key)
        least = min(self.counts[spot] for spot in spots)
        if least < SKETCH_LIMIT:
            for spot in spots:
                if self.counts[spot] == least:
                    self.counts[spot] += 1
        self.counted += 1
        if self.counted >= SKETCH_PERIOD * self.capacity:
            self.counts = bytearray(count >> 1 for count in self.counts)
            self.counted = 0

    def put(self, key: Hashable, parent: Hashable | None) -> None:
        if self.get(key) or (parent is not None and parent not in self.parent):
            return
        recalled = next((kind for kind, keys in self.ghosts.items() if key in keys), None)
        if recalled is not None:
            del self.ghosts[recalled][key]
            if self.last != (parent, recalled):  # once per returning prompt
                self._adapt(recalled)
        while self.live() >= self.capacity:
            self._evict()
        if parent is not None and parent not in self.parent:
            return  # evicted to make room for it: the chunk has no way in any more
        self.last = (key, recalled)
        (self.main if recalled else self.small)[key] = None
        self.clock += 1
        self.used[key] = self.clock
        self._count(key)
        self.parent[key] = parent
        self.depth[key] = 0 if parent is None else self.depth[parent] + 1
        self.num_children[key] = self.credits[key] = 0
        if parent is not None:
            self.children.setdefault(parent, []).insert(0, key)
            self.num_children[parent] = min(self.num_children[parent] + 1, SHARED_CHILDREN)
            above: Hashable | None = parent
            shared = self.num_children[parent] >= SHARED_CHILDREN
            while shared and len(self.children[parent]) >= 2 and above is not None:
                if self.credits[above] >= MAX_CREDITS:
                    break
                self.credits[above] += 1
                above = self.parent[above]

    def _adapt(self, recalled: str) -> None:
        c, b1, b2 = self.live(), len(self.ghosts["small"]), len(self.ghosts["main"])
        step = max(1.0, c / 200)
        if recalled == "small":
            self.p = min(c, self.target() + step * max(b2 / (b1 + 1), 1))
        else:
            self.p = max(0.01 * c, self.target() - step * max(b1 / (b2 + 1), 1))

    def _evict(self) -> None:
        while self.main and len(self.small) >= max(1, self.target()):
            oldest, least = next(iter(self.small)), next(iter(self.main))
            asked, others = self.asked(oldest), self.asked(least)
            shallower = asked == others >= 2 and self.depth[oldest] < self.depth[least]
            if asked < others or (asked == others and not shallower):
                break
            del self.small[oldest]  # asked for more: TinyLFU admits it to main
            self.main[oldest] = None
        if (self.small and len(self.small) >= max(1, self.target())) or not self.main:
            victim, kind = next(iter(self.small)), "small"
        else:
            while self.credits[victim := next(iter(self.main))]:  # shared: one more pass
                self.credits[victim] -= 1
                self.main.move_to_end(victim)
            kind = "main"
            oldest = next(iter(self.small), None)
            if oldest is not None and self.used[oldest] <= self.used[victim]:
                victim, kind = oldest, "small"
        chain = [*self._below(victim), victim]
        c, small, main = self.live(), self.ghosts["small"], self.ghosts["main"]
        for key in chain:
            self.ghosts[kind][key] = None
        while len(small) + len(main) > c:
            drop_small = small and (len(small) > c - self.target() or not main)
            (small if drop_small else main).popitem(last=False)
        for key in chain:
            above = self.parent.pop(key)
            if above is not None and above in self.children:
                self.children[above].remove(key)
            self.children.pop(key, None)
            self.small.pop(key, None)
            self.main.pop(key, None)
            self.used.pop(key, None)
            self.num_children.pop(key, None)
            self.credits.pop(key, None)
            self.depth.pop(key, None)

    def _below(self, key: Hashable) -> list[Hashable]:
        """The chunks below ``key``, leaves first, in the pool's order (``ChunkTree``)."""
        order, stack = [], [key]
        while stack:
            for child in self.children.get(stack.pop(), ()):
                order.append(child)
                stack.append(child)
        return order[::-1]


def read_to_recent(
    key: Hashable, first: OrderedDict[Hashable, None], recent: OrderedDict[Hashable, None]
) -> bool:
    """Whether ``key`` is in either list; if so, move it to the most recent end of ``recent``."""
    if key in first:
        del first[key]
    elif key in recent:
        del recent[key]
    else:
        return False
    recent[key] = None
    return True


MODELS = {"lru": ExactLRU, "s3fifo": ExactS3FIFO, "arc": ExactARC}


def replay(
    model: ExactLRU | ExactS3FIFO | ExactARC | PrefixModel, prompts: Sequence[Sequence[int]]
) -> float:
    """Block hit ratio of ``model`` over ``prompts`` replayed as ``kvcache.simulate`` does:
    each prompt reads its blocks in order up to the first miss, then stores the rest."""
    hits = reads = 0
    for blocks in prompts:
        reads += len(blocks)
        read = 0
        while read < len(blocks) and model.get(blocks[read]):
            read += 1
        hits += read
        for position in range(read, len(blocks)):
            if isinstance(model, PrefixModel):  # each block under the one before it
                model.put(blocks[position], blocks[position - 1] if position else None)
            else:
                model.put(blocks[position])
    return hits / reads if reads else 0.0
