"""The binary layout of a pool segment, and fast views onto it.

A segment is one file in ``/dev/shm``; every process maps all of it::

    offset 0  +-----------------------------+
              | header (4 KiB)              |  magic, version, geometry, config,
              |                             |  lock/dirty state, clock, counters,
              |                             |  retired (destroyed or replaced)
              +-----------------------------+
              | metrics (4 KiB)             |  operators' counters and latency
              |                             |  histograms (``kvcache.counters``)
              +-----------------------------+
              | process table               |  max_processes x (serial, pid, start
              |                             |  time, pid namespace); each slot's
              |                             |  first byte carries its holder's lease
              +-----------------------------+
              | entry table                 |  max_entries x 256-byte records
              +-----------------------------+
              | live list                   |  max_entries x int64: dense ids of
              |                             |  READY entries (eviction samples it)
              +-----------------------------+
              | key index                   |  index_slots x int64: entry id + 1,
              |                             |  0 = empty; open addressing
              +-----------------------------+
              | ghosts                      |  3 x index_slots x int64: a ring of keys
              |                             |  evicted lately and a table to find
              |                             |  them (s3fifo, arc, prefix: see queues)
              +-----------------------------+
              | page links                  |  num_pages x int64: next page of the
              |                             |  same value (or free list), -1 = end
              +-----------------------------+  (4 KiB aligned)
              | data pages                  |  num_pages x page_size
              +-----------------------------+
              | inline slots (format 11)    |  max_entries x inline_bytes: the bytes
              |                             |  of an entry that needs no page
              +-----------------------------+
              | request counts (format 12)  |  prefix pools: a count-min sketch of
              |                             |  one-byte counters (kvcache.sketch)
              +-----------------------------+

Every field is 8 bytes, so the header and entry table are read and written
through ``memoryview`` casts (about 3x faster per scalar than numpy, which
matters on the put/get path) while numpy structured views of the same bytes
serve vectorised work (eviction scoring, repair). All zeros is a valid empty
state for every region except the header, so creating a pool writes only the
header, whatever its size.

An entry's bytes are laid out over its pages as ``key | value header | payload``;
in a pool with inline slots, an entry whose bytes fit its slot (the slot of its
entry id) is written there instead and holds no page (``num_pages`` 0). The
slots follow the pages, so one view of the data region reaches both.
"""

from __future__ import annotations

import contextlib
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import sketch
from .config import PoolConfig
from .errors import IncompatiblePoolError

MAGIC = b"KVCACHE1"
FORMAT_VERSION = 13
READABLE_VERSIONS = (10, 12, 13)
"""13: a pool with inline slots counts the entries in one (``used_slots``, beside
``used_pages``), so that its occupancy is two header words instead of a walk over every
entry under the lock. Every pool with slots is written as 13: a kvcache reading 11 or 12
would not keep the count, so it must refuse such a pool, and format-11 pools (and
format-12 ones with slots) are refused here (persist and restore them). The header later
gained a ring of queue hits deferred by readers without the lock (``deferred``), in words
it left zero: a kvcache that does not drain it makes fewer of those hits, nothing else.
12: a ``prefix`` pool counts requests in a sketch after everything else
(``sketch_bytes``, ``sketch_offset``, ``sketch_counted``; ``kvcache.sketch``), which its
policy's admission to main reads. Only such a pool is written as 12: a kvcache reading 11
would run ``prefix`` without counting, and its admissions would differ from those of the
processes beside it.
11: inline slots after the data pages (``inline_bytes``, ``inline_offset``), where an
entry whose bytes fit takes no page. Only a pool with them is written as 11: a kvcache
reading 10 would take an inline entry for a damaged one, so it must refuse such a pool,
while a pool without them is laid out as 10 was and is still written as 10.
10: the pool lock is a word in the header (``lock_word``, ``flock_users``;
``kvcache.lock``) wherever the compiled engine is built, and flock only for the
handles counted in ``flock_users``. A format-9 kvcache would lock with flock
alone, uncounted, so processes holding the word would not exclude it: format-9
pools are refused, and format-9 kvcache refuses these (persist and restore them).
9: ``prefix`` runs on the exact queues of format 8 (probation with an adaptive
target, main, ghosts) instead of a frequency sketch in the ghost region, so a
format-8 prefix pool's ghost region and entry lists would be read wrong:
format-8 pools are refused (persist and restore them). The header gains the
eviction regret sample (``kvcache.regret``) in words it left zero; the sketch's
word became ``last_admitted``, which a zero leaves meaning "none".
8: ``s3fifo`` and ``arc`` run exactly as their papers define them,
with their queues in the segment: entries gain list links and a read count
(``queue_prev``, ``queue_next``, ``reads``), the header the lists' ends and the
ghost ring's positions, and ARC's target ``probation_target`` is a float; the
ghost region is a ring of evicted keys and a lookup table (``kvcache.queues``)
instead of a direct-mapped table. The longer records move every region, so
format-7 pools are refused (persist and restore them).
7: the remote tier's URL, namespace, password file and the access log's path
left the header for a file of the pool's owner (``kvcache.settings``): anyone who
may write a shared pool may write its header, so nothing there may name a file to
open or a server to dial; the header keeps a serial of the settings and counts
remote records rejected. Format-6 pools are refused (persist and restore them:
snapshots carry no settings).
6: a metrics region follows the header (``kvcache.counters``: bytes in and out,
evictions by reason, failed puts, PrefixCache tokens by model, latency histograms),
moving every region after it, so format-5 pools are refused like older ones;
the header's last word counts the additions to a ``prefix`` pool's frequency
sketch (kept in the ghost region) since it last halved (now ``last_admitted``).
5: entries record their place in a prompt's chunk tree (parent, children,
depth) and probation, and a ghost table remembers keys evicted lately, for the
``prefix`` policy; the longer records move every region, so format-4 pools are
refused (persist them with the kvcache that made them and restore here). The
header also names an access log (path, size cap, and a serial bumped by each
switch; ``kvcache.accesslog``).
4: the header names a remote tier (URL, namespace, write mode, timeout, password
file) and counts its traffic. 3: the header names a lower pool (``spill_to``,
with its ``promote`` mode), counts spills and promotions, and says whether the
last process closed the pool cleanly. 2: entries name their writer by process
slot (not pid) and carry a checksum over their flags, lengths and bytes, and
wall-clock times; the header's ``retired`` word tells attached processes the
pool was destroyed or replaced. 1 was the first."""
HEADER_BYTES = 4096
DEFERRED_SLOTS = 64
"""The header's ring of queue hits deferred by readers that found the lock held (at most
this many wait for its next holder; more are dropped: ``kvcache.fastpath``)."""
METRICS_OFFSET = HEADER_BYTES
METRICS_BYTES = 4096
"""The metrics region (format 6): its own page after the header; see ``kvcache.counters``."""
ALIGN_BYTES = 4096

COUNTERS = (
    "hits",
    "misses",
    "puts",
    "evictions",
    "expirations",
    "repairs",
    "damaged",
    "spills",
    "promotions",
)
"""The header's event counters (``Pool.stats`` reports them; repair resets any out of range)."""

REMOTE_COUNTERS = (
    "hits",
    "misses",
    "bytes_in",
    "bytes_out",
    "writes",
    "dropped",
    "errors",
    "damaged",
    "rejected",
    "calls",
    "micros",
)
"""The remote tier's counters, header fields ``remote_<name>`` (``Pool.remote_stats``):
entries found and not found, bytes received and sent, entries written and dropped
(queue full, remote down), failed calls, entries found damaged, records rejected
(failing the pool's MAC, or a reply that is not one Redis gives for a record), calls
and their total microseconds (for the mean latency)."""

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("format_version", "<i8"),
        # geometry: everything needed to find the regions, validated on open
        ("total_bytes", "<i8"),
        ("page_size_bytes", "<i8"),
        ("num_pages", "<i8"),
        ("max_entries", "<i8"),
        ("index_slots", "<i8"),
        ("max_processes", "<i8"),
        ("procs_offset", "<i8"),
        ("entries_offset", "<i8"),
        ("live_offset", "<i8"),
        ("index_offset", "<i8"),
        ("page_next_offset", "<i8"),
        ("data_offset", "<i8"),
        # configuration
        ("policy", "S16"),
        ("default_ttl_s", "<f8"),  # 0 = none
        ("eviction_samples", "<i8"),
        ("lfu_half_life", "<i8"),
        ("created_at", "<f8"),
        # the chain: set at create, followed by every process that opens the pool
        ("spill_to", "S104"),  # name of the lower pool evicted entries move to; empty = none
        ("promote", "<i8"),  # PROMOTE_ON_HIT or PROMOTE_NEVER: what a hit below does
        # mutable state, changed only under the pool lock
        ("dirty", "<i8"),  # 1 while a holder mutates: set means it died mid-way
        ("clock", "<i8"),  # logical clock: one tick per put and per hit
        ("free_page_head", "<i8"),
        ("num_free_pages", "<i8"),
        ("next_fresh_page", "<i8"),  # pages at and above were never handed out
        ("reserved_pages", "<i8"),  # pages below are backed by posix_fallocate
        ("free_entry_head", "<i8"),  # entry id + 1, 0 = none
        ("next_fresh_entry", "<i8"),
        ("num_live", "<i8"),  # READY entries
        ("used_pages", "<i8"),  # pages held by READY and WRITING entries
        ("next_expiry_at", "<f8"),  # lower bound of live expiries; inf = none
        ("next_sweep_puts", "<i8"),  # no unforced expiry sweep before this many puts
        ("hits", "<i8"),
        ("misses", "<i8"),
        ("puts", "<i8"),
        ("evictions", "<i8"),
        ("expirations", "<i8"),
        ("repairs", "<i8"),
        ("damaged", "<i8"),  # entries dropped because their bytes no longer matched their sum
        ("retired", "<i8"),  # LIVE, or DESTROYED / REPLACED once the file lost its name
        ("spills", "<i8"),  # entries this pool's evictions moved to its lower pool
        ("promotions", "<i8"),  # entries a hit below moved up into this pool
        ("clean", "<i8"),  # 1 once the last process closed it after a flush; 0 while open
        # the remote tier's traffic (its URL and the rest are in kvcache.settings)
        *((f"remote_{name}", "<i8") for name in REMOTE_COUNTERS),
        # format 5: the ghost table (geometry) and the prefix policy's probation count
        ("ghost_offset", "<i8"),
        ("num_probation", "<i8"),  # READY entries on probation (stored, never hit since)
        ("probation_target", "<f8"),  # arc's p: entries probation may hold before it goes first
        ("num_ghosts_probation", "<i8"),  # ghosts of keys that left probation (s3fifo, arc: B1)
        ("num_ghosts_main", "<i8"),  # ghosts of keys that left the main queue (arc: B2)
        # bumped by each change of the pool's settings file (kvcache.settings)
        ("settings_serial", "<i8"),
        # the prefix policy's last admission: (entry id + 1) * 4 + its ghost's kind + 1, 0 =
        # none (kvcache.queues). Formats 6-8 counted a frequency sketch here, which no
        # format-9 pool wrote: its zero reads as "none", so the word needs no format bump
        # (a bump would refuse every pool to gain one word).
        ("last_admitted", "<i8"),
        # format 8: the exact queues of s3fifo and arc (kvcache.queues): ends of the two
        # entry lists (ids + 1, 0 = empty) and the ghost ring's insert and tail positions
        ("probation_head", "<i8"),
        ("probation_tail", "<i8"),
        ("main_head", "<i8"),
        ("main_tail", "<i8"),
        ("ghost_next", "<i8"),  # ghosts ever added: the next one's ring position
        ("ghost_tail_main", "<i8"),  # no ghost of its kind lies before these positions
        ("ghost_tail_probation", "<i8"),
        # format 9: the eviction regret sample (kvcache.regret)
        ("regret_next", "<i8"),
        ("regret_unrequested", "<i8"),
        ("regret_seconds", "<i8", (25,)),
        ("regret_seconds_sum", "<f8"),
        ("regret_accesses", "<i8", (32,)),
        ("regret_accesses_sum", "<i8"),
        ("regret_ring", "<i8", (64 * 3,)),
        # format 10: the pool lock (kvcache.lock): the lock word's owner, and how many
        # handles lock with flock only (zero: "free" and "none")
        ("lock_word", "<i8"),
        ("flock_users", "<i8"),
        # format 11: the inline slots (geometry; both 0 = none)
        ("inline_bytes", "<i8"),
        ("inline_offset", "<i8"),
        # format 12: the request counts of prefix pools (geometry, then the counts added
        # since they last halved; see kvcache.sketch)
        ("sketch_bytes", "<i8"),
        ("sketch_offset", "<i8"),
        ("sketch_counted", "<i8"),
        # format 13: READY and WRITING entries in their inline slot (used_pages' twin)
        ("used_slots", "<i8"),
        # queue hits that readers without the lock left for the lock's holder (lookup.c's
        # defer_hit): positions claimed and drained, and the ring (words it left zero)
        ("deferred_next", "<i8"),
        ("deferred_done", "<i8"),
        ("deferred", "<i8", (DEFERRED_SLOTS,)),
    ]
)

ENTRY_DTYPE = np.dtype(
    [
        ("generation", "<i8"),  # bumped on every state change (seqlock for readers)
        ("state", "<i8"),  # FREE / WRITING / READY
        ("flags", "<i8"),  # KEY_IS_STR
        ("hash_lo", "<i8"),
        ("hash_hi", "<i8"),
        ("key_len", "<i8"),
        ("header_len", "<i8"),
        ("value_len", "<i8"),
        ("first_page", "<i8"),
        ("last_page", "<i8"),
        ("num_pages", "<i8"),
        ("last_access", "<i8"),  # logical clock
        ("created", "<i8"),  # logical clock at insert
        ("accessed_at", "<f8"),  # wall clock of the last put or hit (for people, not policies)
        ("created_at", "<f8"),  # wall clock at insert
        ("freq", "<f8"),  # access count decayed to last_access (LFU)
        ("expires_at", "<f8"),  # wall clock, inf = never
        ("priority", "<i8"),
        ("owner_slot", "<i8"),  # writer's process slot, while WRITING
        ("owner_serial", "<i8"),  # that slot's serial then (a later holder is not the writer)
        ("checksum", "<i8"),  # xxh3-64 of key | value header | payload, set at publish
        ("live_pos", "<i8"),  # position in the live list, while READY
        ("next_free", "<i8"),  # next free entry id + 1, while FREE
        # the chunk tree of prefix-tracking policies (ids + 1, 0 = none); see kvcache.tree
        ("parent", "<i8"),  # the chunk before this one in its prompt
        ("first_child", "<i8"),  # 0 = a leaf
        ("next_sibling", "<i8"),
        ("prev_sibling", "<i8"),
        ("depth", "<i8"),  # chunks before this one in its prompt
        ("probation", "<i8"),  # 1 in s3fifo's small queue or arc's T1 (new, not recalled)
        # format 8: s3fifo's and arc's entry lists (ids + 1, 0 = none; see kvcache.queues)
        ("queue_prev", "<i8"),  # toward the head (most recently queued)
        ("queue_next", "<i8"),  # toward the tail (the next victim)
        # s3fifo: reads since queued, at most 3 (its 2-bit counter); prefix: credits (two
        # bits) and children put under the chunk (policies/prefix.py)
        ("reads", "<i8"),
    ]
)

PROC_DTYPE = np.dtype(
    [
        ("serial", "<i8"),  # bumped by each new holder of the slot
        ("pid", "<i8"),  # for display only: as seen in the holder's own PID namespace
        ("start", "<i8"),  # the holder's start time (clock ticks since boot), for display
        ("pid_ns", "<i8"),  # inode of the holder's PID namespace, 0 = slot unused
    ]
)

FREE, WRITING, READY = 0, 1, 2
LIVE, DESTROYED, REPLACED = 0, 1, 2  # header "retired": set under the lock, never cleared
PROMOTE_ON_HIT, PROMOTE_NEVER = 0, 1  # header "promote"
KEY_IS_STR = 1  # entry flags
VALUE_IS_ARRAY = 2
KNOWN_FLAGS = KEY_IS_STR | VALUE_IS_ARRAY
NO_PAGE = -1
CLOCK_LIMIT = 1 << 62
"""Logical clock values (and counters) stay below this: 2**62 ticks is 146 years at a
billion puts a second, and the headroom keeps ``+ 1`` from overflowing a word."""
PRIORITY_LIMIT = 1 << 62
"""Priorities are below this in absolute value (what ``Pool.put`` accepts)."""

ENTRY_WORDS = ENTRY_DTYPE.itemsize // 8
GHOST_WORDS_PER_SLOT = 3
"""The ghost region's words per index slot (format 8): the ghost ring of ``kvcache.queues``,
its chain links and its bucket heads take one each (so the ring holds at least twice the
entry slots)."""


class _WordIndex:
    """The 8-byte word index of every field of a structured dtype, as attributes.

    Attributes live in the instance dict, so a lookup on the hot path is a plain
    attribute read. ``__getattr__`` exists for type checkers only (every name is an
    ``int``): at run time it would stop CPython from specialising ``E.field``, which
    then costs ~25 ns instead of ~3 ns, many times in every get and put.
    """

    def __init__(self, dtype: np.dtype) -> None:
        for name, (_, offset) in dtype.fields.items():  # type: ignore[union-attr, misc]
            setattr(self, name, offset // 8)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> int: ...


H = _WordIndex(HEADER_DTYPE)
"""Word index of each header field: ``header_q[H.clock]``."""
E = _WordIndex(ENTRY_DTYPE)
"""Word index of each entry field: ``entries_q[eid * ENTRY_WORDS + E.state]``."""


def stored_hash(entries_q: memoryview, eid: int) -> tuple[int, int]:
    """Both halves of the key hash entry ``eid``'s record stores (``hash_lo``, ``hash_hi``)."""
    base = eid * ENTRY_WORDS
    return entries_q[base + E.hash_lo], entries_q[base + E.hash_hi]


def _align(offset: int) -> int:
    return -(-offset // ALIGN_BYTES) * ALIGN_BYTES


@dataclass(frozen=True)
class Geometry:
    """Where each region lives; a pure function of the configuration."""

    page_size_bytes: int
    num_pages: int
    max_entries: int
    index_slots: int
    max_processes: int
    procs_offset: int
    entries_offset: int
    live_offset: int
    index_offset: int
    ghost_offset: int
    page_next_offset: int
    data_offset: int
    inline_bytes: int
    inline_offset: int  # 0 = no inline slots
    sketch_bytes: int
    sketch_offset: int  # 0 = no request counts
    total_bytes: int

    @classmethod
    def for_config(cls, config: PoolConfig) -> Geometry:
        """Lay out the regions for ``config``; the index keeps a load factor <= 1/2."""
        index_slots = 1 << max(1, (2 * config.max_entries - 1).bit_length())
        procs = METRICS_OFFSET + METRICS_BYTES
        entries = _align(procs + config.max_processes * PROC_DTYPE.itemsize)
        live = _align(entries + config.max_entries * ENTRY_DTYPE.itemsize)
        index = _align(live + config.max_entries * 8)
        ghost = _align(index + index_slots * 8)
        page_next = _align(ghost + GHOST_WORDS_PER_SLOT * index_slots * 8)
        data = _align(page_next + config.num_pages * 8)
        pages_end = data + config.num_pages * config.page_size_bytes
        inline_bytes = config.inline_bytes
        inline = _align(pages_end) if inline_bytes else 0
        slots_end = (inline or pages_end) + config.max_entries * inline_bytes
        sketch_bytes = sketch.bytes_for(config.max_entries) if config.counts_requests else 0
        sketch_at = _align(slots_end) if sketch_bytes else 0
        return cls(
            page_size_bytes=config.page_size_bytes,
            num_pages=config.num_pages,
            max_entries=config.max_entries,
            index_slots=index_slots,
            max_processes=config.max_processes,
            procs_offset=procs,
            entries_offset=entries,
            live_offset=live,
            index_offset=index,
            ghost_offset=ghost,
            page_next_offset=page_next,
            data_offset=data,
            inline_bytes=inline_bytes,
            inline_offset=inline,
            sketch_bytes=sketch_bytes,
            sketch_offset=sketch_at,
            total_bytes=(sketch_at + sketch_bytes) if sketch_bytes else slots_end,
        )

    @property
    def metadata_bytes(self) -> int:
        """Bytes spent on everything but data pages and inline slots."""
        return self.data_offset

    def metadata_after_index(self, uses_queues: bool) -> list[tuple[int, int]]:
        """(offset, length) of what follows the key index that a new pool backs with memory
        (the rest of its metadata comes first, in one reservation): the ghost ring only where
        the policy keeps queues (no other touches it, so it stays a hole in the file, which
        costs nothing: 96 bytes per entry at a million entries), the page links, the
        inline slots and the request counts."""
        regions = [(self.page_next_offset, self.data_offset - self.page_next_offset)]
        if uses_queues:
            regions.insert(0, self.ghost_span)
        if self.inline_bytes:
            regions.append((self.inline_offset, self.data_end - self.inline_offset))
        if self.sketch_bytes:
            regions.append((self.sketch_offset, self.sketch_bytes))
        return regions

    def pages_for(self, num_bytes: int) -> int:
        """The pages an entry of ``num_bytes`` (key, codec header and payload, at least the
        key's one byte) takes: none where it fits its inline slot."""
        if num_bytes <= self.inline_bytes:
            return 0
        return -(-num_bytes // self.page_size_bytes)

    def slot_start(self, eid: int) -> int:
        """Where entry ``eid``'s inline slot begins, as an offset in the data region (the
        slots follow the pages)."""
        return self.inline_offset - self.data_offset + eid * self.inline_bytes

    @property
    def data_end(self) -> int:
        """Where the data region (the pages, then the inline slots) ends."""
        if self.inline_bytes:
            return self.inline_offset + self.max_entries * self.inline_bytes
        return self.data_offset + self.num_pages * self.page_size_bytes

    @property
    def ghost_span(self) -> tuple[int, int]:
        """(offset, length) of the ghost region."""
        return self.ghost_offset, self.page_next_offset - self.ghost_offset

    @property
    def format_version(self) -> int:
        """The format a segment of this geometry is written as (see ``FORMAT_VERSION``)."""
        if self.inline_bytes:
            return FORMAT_VERSION
        return 12 if self.sketch_bytes else 10


class Views:
    """Typed windows onto one mapped segment; holds no state of its own.

    ``*_q`` views are ``memoryview`` casts to int64 (``*_d``: float64) for scalar
    access on hot paths; ``entries``/``procs`` are numpy structured views for
    vectorised work. All alias the same shared bytes.
    """

    def __init__(self, buffer: mmap.mmap, geometry: Geometry) -> None:
        g = geometry
        self.geometry = g
        raw = memoryview(buffer)
        self.raw = raw
        self.header = np.ndarray((), HEADER_DTYPE, buffer=buffer, offset=0)
        self.header_q = raw[:HEADER_BYTES].cast("q")
        self.header_d = raw[:HEADER_BYTES].cast("d")
        self.metrics = raw[METRICS_OFFSET : METRICS_OFFSET + METRICS_BYTES]
        entry_bytes = raw[
            g.entries_offset : g.entries_offset + g.max_entries * ENTRY_DTYPE.itemsize
        ]
        self.entries_q = entry_bytes.cast("q")
        self.entries_d = entry_bytes.cast("d")
        self.entries = np.ndarray(
            (g.max_entries,), ENTRY_DTYPE, buffer=buffer, offset=g.entries_offset
        )
        self.procs = np.ndarray(
            (g.max_processes,), PROC_DTYPE, buffer=buffer, offset=g.procs_offset
        )
        self.live_q = raw[g.live_offset : g.live_offset + g.max_entries * 8].cast("q")
        self.live = np.ndarray((g.max_entries,), np.int64, buffer=buffer, offset=g.live_offset)
        self.index_q = raw[g.index_offset : g.index_offset + g.index_slots * 8].cast("q")
        self.index = np.ndarray((g.index_slots,), np.int64, buffer=buffer, offset=g.index_offset)
        ghosts = raw[g.ghost_offset : g.ghost_offset + GHOST_WORDS_PER_SLOT * g.index_slots * 8]
        self.ghost_q = ghosts.cast("q")
        self.page_next_q = raw[g.page_next_offset : g.page_next_offset + g.num_pages * 8].cast("q")
        self.page_next = np.ndarray(
            (g.num_pages,), np.int64, buffer=buffer, offset=g.page_next_offset
        )
        self.data = raw[g.data_offset : g.data_end]
        self.sketch = raw[g.sketch_offset : g.sketch_offset + g.sketch_bytes]

    def release(self) -> None:
        """Drop every view so the mapping can be closed."""
        for name in list(vars(self)):
            view = getattr(self, name)
            if isinstance(view, memoryview):
                # a compiled read copying without the GIL holds it: it goes when that ends
                with contextlib.suppress(BufferError):
                    view.release()
        self.__dict__.clear()


def write_header(
    buffer: mmap.mmap,
    config: PoolConfig,
    geometry: Geometry,
    now_s: float,
    reserved_pages: int,
    *,
    spill_to: str = "",
    promote: int = PROMOTE_ON_HIT,
) -> None:
    """Initialise a new segment's header; the magic goes in last."""
    header = np.ndarray((), HEADER_DTYPE, buffer=buffer, offset=0)
    header["spill_to"] = spill_to.encode()
    header["promote"] = promote
    for name in Geometry.__dataclass_fields__:
        header[name] = getattr(geometry, name)
    header["policy"] = config.policy.encode()
    header["default_ttl_s"] = config.default_ttl_s or 0.0
    header["eviction_samples"] = config.eviction_samples
    header["lfu_half_life"] = config.lfu_half_life
    header["created_at"] = now_s
    header["free_page_head"] = NO_PAGE
    header["next_expiry_at"] = np.inf
    header["reserved_pages"] = reserved_pages
    header["format_version"] = geometry.format_version
    header["magic"] = MAGIC


def read_header(buffer: mmap.mmap, file_bytes: int, where: str) -> tuple[PoolConfig, Geometry]:
    """Validate a segment's header against its file size and rebuild config and geometry.

    Raises:
        IncompatiblePoolError: not a kvcache pool, another format version, or a
            geometry that does not match the file (so no offset can point outside it).
    """
    if file_bytes < HEADER_BYTES:
        raise IncompatiblePoolError(
            f"{where} is not a kvcache pool (too small): remove it or pick another name"
        )
    header = np.ndarray((), HEADER_DTYPE, buffer=buffer, offset=0)
    if header["magic"].item() != MAGIC:
        raise IncompatiblePoolError(
            f"{where} is not a kvcache pool: remove it or pick another name"
        )
    version = int(header["format_version"])
    if version not in READABLE_VERSIONS:
        raise _unreadable(where, version)
    try:
        size_bytes = int(header["num_pages"]) * int(header["page_size_bytes"])
        config = PoolConfig.from_stored(header, size_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IncompatiblePoolError(
            f"{where} has a damaged header ({exc}): destroy and recreate it"
        ) from exc
    geometry = Geometry.for_config(config)
    stored = {name: int(header[name]) for name in Geometry.__dataclass_fields__}
    if stored != vars(geometry) or geometry.total_bytes != file_bytes:
        raise IncompatiblePoolError(
            f"{where} has a damaged header (its geometry does not match the file): "
            "destroy and recreate it"
        )
    if version != geometry.format_version:  # e.g. slots written by a kvcache that read 12
        raise _unreadable(where, version)
    return config, geometry


def _unreadable(where: str, version: int) -> IncompatiblePoolError:
    return IncompatiblePoolError(
        f"{where} has pool format version {version}, this kvcache reads "
        f"{', '.join(map(str, READABLE_VERSIONS[:-1]))} and {READABLE_VERSIONS[-1]} "
        f"(format {FORMAT_VERSION} for pools with inline slots): open it with the kvcache "
        "that made it, or persist it there and restore here"
    )
