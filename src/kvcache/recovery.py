"""Consistency check and repair, both derived from the entry table.

The entry table is the source of truth; the free list, key index, live list
and counters are all derivable from it. ``find_problems`` recomputes them
without trusting anything and reports every disagreement; ``rebuild``
replaces them. Entries are dropped when they were half-written by a process
that died, when their page chain leaves the pool or overlaps another entry's,
when a newer entry has the same key (a crash between the two halves of a
replace), when the chunk before them in their prompt is gone (``kvcache.tree``),
or when a field that decides how their bytes are read is out of range (see
``kvcache.ranges``); out-of-range policy metadata (a last access
beyond the clock, a use count that is not a number) is mended instead, and so
are header words that every later put or get would trip over (a clock or
counter about to overflow, a fresh-page watermark past the pool). The pool's
lock calls ``rebuild`` when it finds that a previous holder died mid-mutation;
``Pool.check`` and ``kvcache health`` call both.

Cost: one Python step per live page, so a repair of a large pool takes
seconds; it only runs after a crash or on request.
"""

from __future__ import annotations

import itertools
import math
import mmap
from dataclasses import dataclass, field

import numpy as np

from . import queues, ranges, regret, tree
from .allocator import PageAllocator, Run
from .config import MAX_KEY_BYTES, PoolConfig
from .entries import EntryTable
from .errors import CorruptPoolError
from .index import HashIndex
from .keys import key_hash
from .layout import (
    CLOCK_LIMIT,
    COUNTERS,
    ENTRY_WORDS,
    FREE,
    HEADER_BYTES,
    HEADER_DTYPE,
    KEY_IS_STR,
    LIVE,
    NO_PAGE,
    PROMOTE_NEVER,
    PROMOTE_ON_HIT,
    READY,
    REMOTE_COUNTERS,
    WRITING,
    E,
    Geometry,
    H,
    Views,
    stored_hash,
    write_header,
)
from .policies import get_policy
from .procs import ProcessTable
from .ranges import MAX_VALUE_HEADER_BYTES

FIXED_HEADER_FIELDS = (
    "magic",
    "format_version",
    *Geometry.__dataclass_fields__,
    "policy",
    "default_ttl_s",
    "eviction_samples",
    "lfu_half_life",
)
"""Header fields set at create and never changed: a later open validates them."""


@dataclass(frozen=True)
class Parts:
    """What recovery reads and rebuilds; ``config``, as opened, mends a damaged header."""

    views: Views
    allocator: PageAllocator
    entries: EntryTable
    index: HashIndex
    procs: ProcessTable
    config: PoolConfig


@dataclass
class _Survey:
    keep: np.ndarray  # per entry slot: stays
    owned: np.ndarray  # per page: held by a kept entry
    ready: list[int]  # kept READY ids
    problems: list[str]
    clock: int  # the logical clock, mended if it was out of range
    mends: list[tuple[int, str, int | float]] = field(default_factory=list)  # (id, field, value)
    header: dict[str, int] = field(default_factory=dict)  # header words to set
    fixed: dict[str, np.ndarray] = field(default_factory=dict)  # damaged fixed fields: values
    fresh_pages: int = 0  # the fresh-page watermark, mended if out of range

    def mend(self, eid: int, name: str, value: int | float, why: str) -> None:
        self.problems.append(f"entry {eid}: {why} (repair mends it)")
        self.mends.append((eid, name, value))


def _survey(parts: Parts) -> _Survey:
    """Decide which entries are sound and what to mend, trusting nothing but the records."""
    v, g = parts.views, parts.views.geometry
    problems: list[str] = []
    used = v.header_q[H.next_fresh_entry]
    if not 0 <= used <= g.max_entries:
        problems.append(f"entry watermark {used} is outside the table")
        used = g.max_entries  # rebuild() writes it back; a check only reports
    states = v.entries["state"][:used]
    candidates = np.flatnonzero((states == READY) | (states == WRITING))
    for eid in np.flatnonzero((states != FREE) & (states != READY) & (states != WRITING)).tolist():
        problems.append(f"entry {eid}: unknown state {states[eid]}")
    clock = _clock(parts, candidates)  # reported with the other header words
    survey = _Survey(
        np.zeros(g.max_entries, bool), np.zeros(g.num_pages, bool), [], problems, clock
    )
    _survey_generations(v, survey)
    runs: dict[int, list[Run]] = {}
    hashes: dict[int, tuple[int, int]] = {}
    for eid in candidates.tolist():
        problem = _structure_problem(parts, eid, runs, hashes)
        if problem:
            problems.append(f"entry {eid}: {problem}")
    _survey_metadata(v, runs, hashes, survey)
    winners = _newest_per_key(v, [eid for eid in hashes if eid in runs])
    for eid, chain in runs.items():
        problem = _sharing_problem(v, eid, chain, eid in winners, survey.owned)
        if not problem and eid in hashes and hashes[eid] != stored_hash(v.entries_q, eid):
            problem = "its key hash does not match its key"  # either may be the damaged one
        if problem:
            problems.append(f"entry {eid}: {problem}")
            continue
        for start, count in chain:
            survey.owned[start : start + count] = True
        survey.keep[eid] = True
        if eid in hashes:
            survey.ready.append(eid)
    _survey_tree(v, runs, survey, get_policy(parts.config.policy).tracks_prefixes)
    _survey_header(parts, survey)
    return survey


def _survey_tree(
    v: Views, runs: dict[int, list[Run]], survey: _Survey, tracks_prefixes: bool
) -> None:
    """Drop the READY entries whose parent chunk is not kept: no prefix lookup reaches them.
    In a pool whose policy keeps no chunk tree, a link is damage: mended to none (its
    deletes would not cascade, so a kept link would strand later)."""
    ready = np.array(survey.ready, np.int64)
    if not tracks_prefixes:
        # every slot, free ones too: a slot is reused without its links being written
        for name in tree.LINK_FIELDS:
            for eid in np.flatnonzero(v.entries[name] != 0).tolist():
                survey.mend(eid, name, 0, f"{name} is set in a pool that keeps no chunk tree")
        return
    lost = tree.stranded(v.entries, ready).tolist()
    for eid in lost:
        survey.problems.append(f"entry {eid}: the chunk before it in its prompt is gone")
        survey.keep[eid] = False
        for start, count in runs[eid]:
            survey.owned[start : start + count] = False
    if lost:
        gone = set(lost)
        survey.ready = [eid for eid in survey.ready if eid not in gone]


def _tree_problems(v: Views, ready: list[int]) -> list[str]:
    """How the chunk tree's child lists and probation count disagree with the parent fields."""
    q, children = v.entries_q, {eid: set[int]() for eid in ready}
    for eid in ready:
        base = eid * ENTRY_WORDS
        parent = q[base + E.parent]
        # stranded entries were dropped, so a parent is ready; in a pool without a chunk
        # tree, the survey already reported (and mends) any link
        if parent and parent - 1 in children:
            children[parent - 1].add(eid)
        elif not parent and (q[base + E.next_sibling] or q[base + E.prev_sibling]):
            return [f"chunk tree: entry {eid} starts a prompt but has siblings"]
    for eid, expected in children.items():
        found: set[int] = set()
        before, child = 0, q[eid * ENTRY_WORDS + E.first_child]
        while child and len(found) <= len(expected) and child - 1 not in found:
            if child - 1 not in expected:  # out of range, not ready, or another's: damaged
                break
            if q[(child - 1) * ENTRY_WORDS + E.prev_sibling] != before:
                break  # a broken back link: removing that child would write elsewhere
            found.add(child - 1)
            before, child = child, q[(child - 1) * ENTRY_WORDS + E.next_sibling]
        if child or found != expected:
            return [f"chunk tree: entry {eid}'s list of children does not match their parents"]
    num_probation = int(np.count_nonzero(v.entries["probation"][ready]))
    if v.header_q[H.num_probation] != num_probation:
        return [f"probation counter is {v.header_q[H.num_probation]}, {num_probation} expected"]
    return []


def _clock(parts: Parts, candidates: np.ndarray) -> int:
    """The logical clock or, if it is out of range, the latest in-range clock value of an entry."""
    clock = parts.views.header_q[H.clock]
    if 0 <= clock < CLOCK_LIMIT:
        return clock
    records = parts.views.entries[candidates]
    values = np.concatenate([records["last_access"], records["created"]])
    return int(values[(values >= 0) & (values < CLOCK_LIMIT)].max(initial=0))


def _clock_now(v: Views, survey: _Survey) -> int:
    """The header's clock as it reads now, taken as the survey's where it is in range and
    not behind it: compiled readers without the lock tick it while a check runs (and set
    an entry's last access to the tick after it)."""
    clock = v.header_q[H.clock]
    if survey.clock <= clock < CLOCK_LIMIT:
        survey.clock = clock
    return clock


def _survey_generations(v: Views, survey: _Survey) -> None:
    """Generations that their next bump would overflow restart (every slot: fresh ones too)."""
    generations = v.entries["generation"]
    for eid in np.flatnonzero((generations < 0) | (generations >= CLOCK_LIMIT)).tolist():
        survey.mend(eid, "generation", 0, f"generation {generations[eid]} is out of range")


def _structure_problem(
    parts: Parts, eid: int, runs: dict[int, list[Run]], hashes: dict[int, tuple[int, int]]
) -> str | None:
    """Why entry ``eid``'s pages cannot be read, or None.

    If they can, sets ``runs[eid]`` (its page chain) and, for a READY entry,
    ``hashes[eid]``: the hash of the key that its pages hold.
    """
    q, base = parts.views.entries_q, eid * ENTRY_WORDS
    page_size = parts.views.geometry.page_size_bytes
    if q[base + E.state] == WRITING:
        slot = q[base + E.owner_slot]
        if not parts.procs.is_live(slot, q[base + E.owner_serial]):
            return f"half-written by process {parts.procs.pid_of(slot)}, which died"
    lengths = (q[base + E.key_len], q[base + E.header_len], q[base + E.value_len])
    num_pages, geometry = q[base + E.num_pages], parts.views.geometry
    if (
        not 1 <= lengths[0] <= MAX_KEY_BYTES
        or not 0 <= lengths[1] <= MAX_VALUE_HEADER_BYTES
        or lengths[2] < 0
        or num_pages != geometry.pages_for(sum(lengths))
    ):
        return f"lengths {lengths} do not match its {num_pages} pages"
    if num_pages:
        try:
            chain = parts.allocator.runs(q[base + E.first_page], num_pages)
        except CorruptPoolError:
            return "its page chain leaves the pool"
        last_start, last_count = chain[-1]
        if last_start + last_count - 1 != q[base + E.last_page]:
            return "its page chain does not end at its last page"
        if any(s1 + c1 > s2 for (s1, c1), (s2, _) in itertools.pairwise(sorted(chain))):
            return "its page chain visits a page twice"
        start = chain[0][0] * page_size  # a key always fits in its first page
    else:  # in its inline slot, which no other entry has
        chain, start = [], geometry.slot_start(eid)
    if q[base + E.state] == READY:  # a WRITING entry's bytes may still be on their way
        key = bytes(parts.views.data[start : start + lengths[0]])
        if q[base + E.flags] & KEY_IS_STR:
            try:
                key.decode("utf-8")
            except UnicodeDecodeError:
                return "its text key is not UTF-8"
        hashes[eid] = key_hash(key)
    runs[eid] = chain
    return None


def _survey_metadata(
    v: Views, runs: dict[int, list[Run]], hashes: dict[int, tuple[int, int]], survey: _Survey
) -> None:
    """Range-check the READY entries: mend policy metadata, drop (from ``runs``) the others."""
    ids = np.fromiter(hashes, np.int64, len(hashes))
    records = v.entries[ids]
    _clock_now(v, survey)  # after the records: at or past each last access they hold
    for fault in ranges.entry_faults(records, survey.clock):
        bad = zip(ids[fault.bad].tolist(), records[fault.field][fault.bad].tolist(), strict=True)
        for eid, value in bad:
            if fault.field in ranges.MENDS:
                value = ranges.mended(fault.field, value, survey.clock)
                survey.mend(eid, fault.field, value, fault.why)
            elif eid in runs:
                survey.problems.append(f"entry {eid}: {fault.why}")
                del runs[eid]


def _newest_per_key(v: Views, ready: list[int]) -> set[int]:
    """Of these READY entries, the newest for each key hash they are filed under."""
    q = v.entries_q
    newest: dict[tuple[int, int], int] = {}
    for eid in ready:
        key = stored_hash(v.entries_q, eid)
        other = newest.get(key)
        if other is None or q[other * ENTRY_WORDS + E.created] < q[eid * ENTRY_WORDS + E.created]:
            newest[key] = eid
    return set(newest.values())


def _sharing_problem(
    v: Views, eid: int, chain: list[Run], newest: bool, owned: np.ndarray
) -> str | None:
    """Why entry ``eid`` gives way to another (a newer one of its key, an earlier owner
    of its pages), or None."""
    if v.entries_q[eid * ENTRY_WORDS + E.state] == READY and not newest:
        return "an older duplicate of a key stored again"
    if any(owned[start : start + count].any() for start, count in chain):
        return "its pages are also another entry's"
    return None


def _survey_header(parts: Parts, survey: _Survey) -> None:
    """Header words that later puts and gets would trip over, and what to set them to."""
    g, h = parts.views.geometry, parts.views.header_q
    owned = np.flatnonzero(survey.owned)
    lowest = int(owned[-1]) + 1 if owned.size else 0  # pages at and above were never handed out
    fresh = h[H.next_fresh_page]
    if not lowest <= fresh <= g.num_pages:
        fresh = min(g.num_pages, max(fresh, lowest))
    survey.fresh_pages = fresh
    # Each moving word is read once: compiled readers without the lock tick the clock and
    # the hit count while this runs, so a second read could differ from the first in range.
    seen = {"clock": _clock_now(parts.views, survey)}
    wanted = {"clock": survey.clock, "next_fresh_page": fresh}
    for name in (*COUNTERS, *(f"remote_{name}" for name in REMOTE_COUNTERS)):
        seen[name] = count = h[getattr(H, name)]
        wanted[name] = count if 0 <= count < CLOCK_LIMIT else 0
    sweep, reserved = h[H.next_sweep_puts], h[H.reserved_pages]
    wanted["next_sweep_puts"] = sweep if 0 <= sweep <= wanted["puts"] + g.max_entries else 0
    wanted["reserved_pages"] = reserved if fresh <= reserved <= g.num_pages else fresh
    # DESTROYED and REPLACED never reach here (the lock refuses them): anything else is damage
    wanted["retired"] = LIVE
    if not get_policy(parts.config.policy).uses_queues:  # else queues.find_problems checks
        wanted["num_ghosts_probation"] = wanted["num_ghosts_main"] = 0
    wanted["promote"] = h[H.promote] if h[H.promote] in (PROMOTE_ON_HIT, PROMOTE_NEVER) else 0
    wanted["clean"] = 0  # it is open: whoever closes it last sets it after a flush
    for name, value in wanted.items():
        current = seen[name] if name in seen else h[getattr(H, name)]
        if current != value:
            survey.problems.append(f"header {name} {current} is out of range (repair sets {value})")
            survey.header[name] = value
    expected = _new_header(parts)
    for name in FIXED_HEADER_FIELDS:
        if parts.views.header[name].tobytes() != expected[name].tobytes():
            survey.problems.append(
                f"header {name} is damaged (repair writes back this process's copy)"
            )
            survey.fixed[name] = expected[name]


def _new_header(parts: Parts) -> np.ndarray:
    """The header that creating this pool writes: what its fixed fields must hold."""
    image = mmap.mmap(-1, HEADER_BYTES)
    write_header(image, parts.config, parts.views.geometry, 0.0, 0)
    return np.ndarray((), HEADER_DTYPE, buffer=image)


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
    slots = _slots_held(v, survey.keep)
    if h[H.used_slots] != slots:
        problems.append(f"used slots counter is {h[H.used_slots]}, entries hold {slots}")
    expected_free = set(np.flatnonzero(~survey.owned[: survey.fresh_pages]).tolist())
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
    problems += _index_problems(parts, survey.ready)
    problems += _tree_problems(v, survey.ready)
    if get_policy(parts.config.policy).uses_queues:
        problems += queues.find_problems(v, survey.ready)
    problems += regret.find_problems(v)
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
    bound = v.header_d[H.next_expiry_at]
    if not bound <= _earliest_expiry(v, survey.ready):  # not <=: NaN fails too
        problems.append(f"next expiry bound {bound} is later than an entry's expiry")
    return problems, survey.ready


def _index_problems(parts: Parts, ready: list[int]) -> list[str]:
    """How the key index fails to hold each READY entry exactly once, findable by its hash."""
    indexed = parts.index.indexed_ids()
    if len(indexed) == parts.views.geometry.index_slots:
        return ["key index has no empty slot (a lookup of a missing key would never end)"]
    q = parts.views.entries_q
    # Counts and sets first: once they agree every slot holds a sound id, so a probe ends.
    if (
        len(indexed) != len(ready)
        or set(indexed) != set(ready)
        or any(
            parts.index.find(q[e * ENTRY_WORDS + E.hash_lo], q[e * ENTRY_WORDS + E.hash_hi]) != e
            for e in ready
        )
    ):
        return ["key index does not match the ready entries"]
    return []


def _earliest_expiry(v: Views, ready: list[int]) -> float:
    return float(v.entries["expires_at"][ready].min(initial=math.inf))


def _slots_held(v: Views, keep: np.ndarray) -> int:
    """How many of the entries that stay lie in their inline slot (they hold no page)."""
    if not v.geometry.inline_bytes:
        return 0
    return int(np.count_nonzero(keep & (v.entries["num_pages"] == 0)))


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
    """Mend what is out of range, then rebuild free list, index, live list and counters."""
    survey = _survey(parts)
    v, h = parts.views, parts.views.header_q
    for eid, name, value in survey.mends:
        v.entries[name][eid] = value
    for name, word in survey.header.items():
        h[getattr(H, name)] = word
    for name, stored in survey.fixed.items():
        v.header[name] = stored
    if not 0 <= h[H.next_fresh_entry] <= v.geometry.max_entries:
        h[H.next_fresh_entry] = v.geometry.max_entries
    parts.entries.rebuild(survey.keep)
    parts.allocator.rebuild(survey.owned)
    h[H.used_slots] = _slots_held(v, survey.keep)
    parts.index.rebuild(survey.ready)
    ready = np.array(survey.ready, np.int64)
    tree.rebuild(v.entries, ready)
    if regret.find_problems(v):
        regret.RegretSample(v).reset()
    if get_policy(parts.config.policy).uses_queues:
        queues.rebuild(v, ready)
    else:  # no queues: no entry is on probation, whatever a damaged word says
        v.entries["probation"][:] = 0
        h[H.num_probation] = 0
    v.header_d[H.next_expiry_at] = _earliest_expiry(v, survey.ready)
