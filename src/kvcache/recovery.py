"""Consistency check and repair, both derived from the entry table.

The entry table is the source of truth; the free list, key index, live list
and counters are all derivable from it. ``find_problems`` recomputes them
without trusting anything and reports every disagreement; ``rebuild``
replaces them. Entries are dropped when they were half-written by a process
that died, when their page chain leaves the pool or overlaps another entry's,
or when a newer entry has the same key (a crash between the two halves of a
replace). The pool's lock calls ``rebuild`` when it finds that a previous
holder died mid-mutation; ``Pool.check`` and ``cortex cache health`` call both.

Cost: one Python step per live page, so a repair of a large pool takes
seconds; it only runs after a crash or on request.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .allocator import PageAllocator
from .entries import EntryTable
from .errors import CorruptPoolError
from .index import HashIndex
from .layout import ENTRY_WORDS, NO_PAGE, READY, WRITING, E, H, Views
from .procs import ProcessTable


@dataclass(frozen=True)
class Parts:
    """The structures recovery reads and rebuilds."""

    views: Views
    allocator: PageAllocator
    entries: EntryTable
    index: HashIndex
    procs: ProcessTable


@dataclass
class _Survey:
    keep: np.ndarray  # per entry slot: stays
    owned: np.ndarray  # per page: held by a kept entry
    ready: list[int]  # kept READY ids
    problems: list[str]


def _survey(parts: Parts) -> _Survey:
    """Decide which entries are sound, trusting nothing but the records."""
    v, g = parts.views, parts.views.geometry
    h, q = v.header_q, v.entries_q
    survey = _Survey(np.zeros(g.max_entries, bool), np.zeros(g.num_pages, bool), [], [])
    used = h[H.next_fresh_entry]
    if not 0 <= used <= g.max_entries:
        survey.problems.append(f"entry watermark {used} is outside the table")
        used = g.max_entries  # rebuild() writes it back; a check only reports
    states = v.entries["state"][:used]
    candidates = np.flatnonzero((states == READY) | (states == WRITING)).tolist()
    newest: dict[tuple[int, int], int] = {}
    for eid in candidates:
        base = eid * ENTRY_WORDS
        if q[base + E.state] == READY:
            key = (q[base + E.hash_lo], q[base + E.hash_hi])
            other = newest.get(key)
            if other is None or q[other * ENTRY_WORDS + E.created] < q[base + E.created]:
                newest[key] = eid
    winners = set(newest.values())
    for eid in candidates:
        problem = _entry_problem(parts, eid, eid in winners, survey.owned)
        if problem:
            survey.problems.append(f"entry {eid}: {problem}")
            continue
        survey.keep[eid] = True
        if q[eid * ENTRY_WORDS + E.state] == READY:
            survey.ready.append(eid)
    return survey


def _entry_problem(parts: Parts, eid: int, newest: bool, owned: np.ndarray) -> str | None:
    """Why entry ``eid`` must go, or None; marks its pages owned if it stays."""
    q, base = parts.views.entries_q, eid * ENTRY_WORDS
    page_size = parts.views.geometry.page_size_bytes
    if q[base + E.state] == WRITING:
        slot = q[base + E.owner_slot]
        if not parts.procs.is_live(slot, q[base + E.owner_serial]):
            return f"half-written by process {parts.procs.pid_of(slot)}, which died"
    elif not newest:
        return "an older duplicate of a key stored again"
    lengths = (q[base + E.key_len], q[base + E.header_len], q[base + E.value_len])
    num_pages = q[base + E.num_pages]
    if (
        min(lengths) < 0
        or lengths[0] < 1
        or num_pages != max(1, math.ceil(sum(lengths) / page_size))
    ):
        return f"lengths {lengths} do not match its {num_pages} pages"
    try:
        runs = parts.allocator.runs(q[base + E.first_page], num_pages)
    except CorruptPoolError:
        return "its page chain leaves the pool"
    last_start, last_count = runs[-1]
    if last_start + last_count - 1 != q[base + E.last_page]:
        return "its page chain does not end at its last page"
    ordered = sorted(runs)
    if any(s1 + c1 > s2 for (s1, c1), (s2, _) in itertools.pairwise(ordered)):
        return "its page chain visits a page twice"
    if any(owned[start : start + count].any() for start, count in runs):
        return "its pages are also another entry's"
    for start, count in runs:
        owned[start : start + count] = True
    return None


def find_problems(parts: Parts) -> list[str]:
    """Every way the pool's derived structures disagree with its entry table."""
    return inspect(parts)[0]


def inspect(parts: Parts) -> tuple[list[str], list[int]]:
    """``find_problems``, and the ids of the READY entries found sound (whose bytes
    ``Pool.check`` then verifies against their checksums)."""
    v, h = parts.views, parts.views.header_q
    survey = _survey(parts)
    problems = survey.problems
    ready = set(survey.ready)
    if h[H.used_pages] != int(survey.owned.sum()):
        problems.append(
            f"used pages counter is {h[H.used_pages]}, entries hold {int(survey.owned.sum())}"
        )
    expected_free = set(np.flatnonzero(~survey.owned[: h[H.next_fresh_page]]).tolist())
    free = _walk_free_list(v, len(expected_free))
    if free != expected_free:
        problems.append(
            f"free list has {len(free)} pages, {len(expected_free)} expected "
            f"({len(free - expected_free)} wrong, {len(expected_free - free)} leaked)"
        )
    if h[H.num_free_pages] != len(expected_free):
        problems.append(
            f"free pages counter is {h[H.num_free_pages]}, {len(expected_free)} expected"
        )
    if set(parts.index.indexed_ids()) != ready or any(
        parts.index.find(
            v.entries_q[e * ENTRY_WORDS + E.hash_lo], v.entries_q[e * ENTRY_WORDS + E.hash_hi]
        )
        != e
        for e in ready
    ):
        problems.append("key index does not match the ready entries")
    num_live = h[H.num_live]
    live = v.live[: max(0, min(num_live, v.geometry.max_entries))]
    if (
        num_live != len(ready)
        or set(live.tolist()) != ready
        or any(
            v.entries_q[e * ENTRY_WORDS + E.live_pos] != pos for pos, e in enumerate(live.tolist())
        )
    ):
        problems.append(f"live list ({num_live} ids) does not match the {len(ready)} ready entries")
    used = min(max(0, h[H.next_fresh_entry]), v.geometry.max_entries)
    unused = set(np.flatnonzero(~survey.keep[:used]).tolist())
    if _walk_free_entries(v, len(unused)) != unused:
        problems.append(f"free entry chain does not match the {len(unused)} unused entry slots")
    return problems, survey.ready


def _walk_free_list(v: Views, expected: int) -> set[int]:
    """Pages on the free list, stopping at a bad link or after more than ``expected``."""
    pages: set[int] = set()
    page, limit = v.header_q[H.free_page_head], v.geometry.num_pages
    while page != NO_PAGE and 0 <= page < limit and len(pages) <= expected and page not in pages:
        pages.add(page)
        page = v.page_next_q[page]
    if page != NO_PAGE:
        pages.add(-1)  # a bad link, a cycle or too many pages: never equal to the expected set
    return pages


def _walk_free_entries(v: Views, expected: int) -> set[int]:
    """Entry ids on the free chain, stopping at a bad link or after more than ``expected``."""
    ids: set[int] = set()
    head, limit = v.header_q[H.free_entry_head], v.geometry.max_entries
    while 0 < head <= limit and len(ids) <= expected and head - 1 not in ids:
        ids.add(head - 1)
        head = v.entries_q[(head - 1) * ENTRY_WORDS + E.next_free]
    if head:
        ids.add(-1)  # a bad link, a cycle or too many ids: never equal to the expected set
    return ids


def rebuild(parts: Parts) -> None:
    """Rebuild free list, index, live list and counters from the sound entries."""
    survey = _survey(parts)
    v, h = parts.views, parts.views.header_q
    if not 0 <= h[H.next_fresh_entry] <= v.geometry.max_entries:
        h[H.next_fresh_entry] = v.geometry.max_entries
    parts.entries.rebuild(survey.keep)
    parts.allocator.rebuild(survey.owned)
    parts.index.rebuild(survey.ready)
    expiries = v.entries["expires_at"][survey.ready]
    v.header_d[H.next_expiry_at] = float(expiries.min()) if expiries.size else math.inf
