"""The chunk tree of prefix-tracking pools: each chunk's parent, children and depth.

A prompt's chunk i+1 is reachable only through chunk i (a prefix lookup stops
at the first missing chunk), so a chunk whose parent is gone only takes room.
Pools whose policy tracks prefixes (``prefix``) link each chunk put with a
``parent`` into a tree kept in the entry records, so that removing a chunk
removes its descendants with it and the policy can tell leaves from chunks
other prompts build on. Links are entry ids + 1 (0 = none)::

    parent.first_child -> child -> next_sibling -> child -> 0
                          0 <- prev_sibling <-      (each child's parent: parent)

Every operation here is O(1) but ``descendants`` and ``adopt`` (O(what they
return or move)); the caller holds the pool lock. Every link followed is
checked to name an entry slot, and every walk is bounded by the table's size,
so damaged links (a cycle, an id past the table) are a ``CorruptPoolError``,
never a hang or a write elsewhere.
"""

from __future__ import annotations

import numpy as np

from .errors import corrupt
from .layout import ENTRY_WORDS, E, Views

LINK_FIELDS = ("parent", "first_child", "next_sibling", "prev_sibling")


class ChunkTree:
    """Parent/child links over a pool's entry table."""

    def __init__(self, views: Views) -> None:
        self._q = views.entries_q
        self._limit = len(views.entries)

    def _id(self, link: int) -> int:
        """The entry a nonzero link names, checked to be a slot of the table."""
        if not 0 < link <= self._limit:
            raise corrupt(f"chunk tree link {link} is outside the entry table")
        return link - 1

    def parent(self, eid: int) -> int:
        """The chunk ``eid`` was put under, or -1 (a root)."""
        link = self._q[eid * ENTRY_WORDS + E.parent]
        return self._id(link) if link else -1

    def depth(self, eid: int) -> int:
        """The chunks before ``eid`` in its prompt (0: a root)."""
        return self._q[eid * ENTRY_WORDS + E.depth]

    def has_two_children(self, eid: int) -> bool:
        """Whether ``eid`` holds two children or more now (its first has a sibling)."""
        link = self._q[eid * ENTRY_WORDS + E.first_child]
        return bool(link) and self._q[self._id(link) * ENTRY_WORDS + E.next_sibling] != 0

    def link(self, eid: int, parent: int) -> None:
        """Make ``eid`` (fresh, unlinked) the first child of ``parent`` (-1: a root)."""
        q, base = self._q, eid * ENTRY_WORDS
        q[base + E.first_child] = q[base + E.prev_sibling] = 0
        q[base + E.parent] = parent + 1
        if parent < 0:
            q[base + E.next_sibling] = q[base + E.depth] = 0
            return
        pbase = parent * ENTRY_WORDS
        q[base + E.depth] = q[pbase + E.depth] + 1
        head = q[pbase + E.first_child]
        q[base + E.next_sibling] = head
        if head:
            q[self._id(head) * ENTRY_WORDS + E.prev_sibling] = eid + 1
        q[pbase + E.first_child] = eid + 1

    def unlink(self, eid: int) -> None:
        """Take ``eid`` out of its parent's children (its own children stay its)."""
        q, base = self._q, eid * ENTRY_WORDS
        prev, after = q[base + E.prev_sibling], q[base + E.next_sibling]
        if prev:
            q[self._id(prev) * ENTRY_WORDS + E.next_sibling] = after
        elif q[base + E.parent]:
            q[self._id(q[base + E.parent]) * ENTRY_WORDS + E.first_child] = after
        if after:
            q[self._id(after) * ENTRY_WORDS + E.prev_sibling] = prev
        q[base + E.parent] = q[base + E.prev_sibling] = q[base + E.next_sibling] = 0

    def adopt(self, eid: int, old: int) -> None:
        """Give ``old``'s children to ``eid``, a new entry replacing it under the same key."""
        q = self._q
        child = q[old * ENTRY_WORDS + E.first_child]
        q[eid * ENTRY_WORDS + E.first_child] = child
        q[old * ENTRY_WORDS + E.first_child] = 0
        for _ in range(self._limit + 1):
            if not child:
                return
            q[self._id(child) * ENTRY_WORDS + E.parent] = eid + 1
            child = q[(child - 1) * ENTRY_WORDS + E.next_sibling]
        raise corrupt("chunk tree: a list of children loops")

    def is_below(self, eid: int, ancestor: int) -> bool:
        """Whether ``eid`` is ``ancestor`` or one of its descendants (a walk up: O(depth))."""
        q = self._q
        for _ in range(self._limit + 1):
            if eid == ancestor:
                return True
            parent = q[eid * ENTRY_WORDS + E.parent]
            if not parent:
                return False
            eid = self._id(parent)
        raise corrupt("chunk tree: a chunk is its own ancestor")

    def descendants(self, eid: int) -> list[int]:
        """Every chunk below ``eid``, children after their own descendants (safe to remove
        in this order, leaves first)."""
        q, order, stack = self._q, [], [eid]
        while stack:
            child = q[stack.pop() * ENTRY_WORDS + E.first_child]
            while child:
                order.append(self._id(child))
                if len(order) > self._limit:
                    raise corrupt("chunk tree: a chunk is its own descendant")
                stack.append(child - 1)
                child = q[(child - 1) * ENTRY_WORDS + E.next_sibling]
        return order[::-1]


def stranded(records: np.ndarray, ready: np.ndarray) -> np.ndarray:
    """Of the ``ready`` ids, those whose parent (or an ancestor's) is not among them (repair).

    Args:
        records: the whole entry table.
    """
    kept = np.zeros(records.size, bool)
    kept[ready] = True
    lost_all = [ready[:0]]
    while True:
        parents = records["parent"][ready]
        in_table = (parents >= 0) & (parents <= records.size)
        ok = (parents == 0) | (in_table & kept[np.clip(parents - 1, 0, records.size - 1)])
        lost = ready[~ok]
        if not lost.size:
            return np.concatenate(lost_all)
        kept[lost] = False
        lost_all.append(lost)
        ready = ready[ok]


def rebuild(records: np.ndarray, ready: np.ndarray) -> None:
    """Relink children and siblings from the ``ready`` ids' parent fields (repair), which
    ``stranded`` found sound; every other slot is unlinked."""
    links = {name: np.zeros(records.size, np.int64) for name in LINK_FIELDS}
    parents = records["parent"][ready]
    links["parent"][ready] = parents
    heads: dict[int, int] = {}
    for eid, parent in zip(ready.tolist(), parents.tolist(), strict=True):
        if parent:
            after = heads.get(parent, 0)
            links["next_sibling"][eid] = after
            if after:
                links["prev_sibling"][after - 1] = eid + 1
            heads[parent] = eid + 1
    for parent, head in heads.items():
        links["first_child"][parent - 1] = head
    for name, values in links.items():
        records[name] = values
