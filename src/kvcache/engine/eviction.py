"""Eviction: making room for puts, explicit evictions, expiry sweeps, dead writers.

``Evictor`` holds the segment's ``Table`` and its policy: the policy chooses,
the evictor frees (through ``Table.remove``). ``Store`` wires it in as the
table's ``make_room`` and calls it, under the lock, for explicit evictions:

- ``make_room`` runs on put when pages or an entry slot are short: first a
  spaced ``tidy`` (expired entries, pages of writers that died), then victims
  from ``policies.choose_victims`` until the put fits. When the machine will
  not back more pages (a full /dev/shm, or the memory check), it runs again
  counting only the pages the pool already has: the pool stops growing and
  keeps serving puts by eviction. Where the compiled put found no room,
  ``room_for_put`` makes the room, its first round in one compiled call.
- ``Store.evict`` ranks every entry exactly (``rank_all``) and removes them in
  batches, releasing the lock between batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np

from .. import fastpath, native
from ..errors import OutOfSharedMemoryError, PoolFullError, corrupt
from ..layout import ENTRY_WORDS, READY, WRITING, E, H
from ..policies import QueuePolicy, ScoreContext, choose_victims, rank_victims, sample_batch
from ..procs import ProcessTable
from .table import Table

GROWTH_RETRY_S = 1.0
"""After the machine refused to back more of a pool's pages, its puts fit the
pages it has for this long before this process asks again. Asking costs a
fresh reading of every memory limit (``memory.Room``), and asking on every put
made puts into a full /dev/shm 3.4x slower (146 vs 43 us, 2 KB values in
64 KiB pages, each put evicting one)."""
EVICT_BATCH = 1024
"""Explicit evictions release the lock after this many removals, so other
processes are never stalled for the whole of a large eviction."""
SWEEP_SPACING = 64
"""Unforced tidies are at least num_live / 64 puts apart (see tidy)."""
SPILL_ROUNDS = 64
"""At most this many victim draws per move to a lower tier; the ordinary eviction does the
rest."""


class _Refusal(NamedTuple):
    until_s: float
    length: int
    error_type: type[OutOfSharedMemoryError]
    message: str  # not the exception: its traceback would keep the pool's frames alive


class Growth:
    """The allocator's ``reserve``: backs more pages, and remembers a refusal for a while.

    Within ``GROWTH_RETRY_S`` of a refusal, a request at least as large is
    refused again at once, with the same message; a smaller one is tried.
    """

    def __init__(self, reserve: Callable[[int, int], None], clock: Callable[[], float]) -> None:
        self._reserve = reserve
        self._clock = clock
        self._refusal: _Refusal | None = None

    def __call__(self, offset: int, length: int) -> None:
        refusal = self._refusal
        if refusal is not None and length >= refusal.length and self._clock() < refusal.until_s:
            raise refusal.error_type(refusal.message)
        try:
            self._reserve(offset, length)
        except OutOfSharedMemoryError as exc:
            self._refusal = _Refusal(self._clock() + GROWTH_RETRY_S, length, type(exc), str(exc))
            raise
        self._refusal = None


class Evictor:
    """Room-making for one segment's puts, and the ranking behind explicit evictions.

    Every method expects the caller to hold the segment's lock.
    """

    def __init__(
        self,
        table: Table,
        procs: ProcessTable,
        rng: np.random.Generator,
        writer: Any = None,
    ) -> None:
        """``writer``: the compiled writes (``fastpath.compiled_writer``), or None: its
        ``evict`` does ``evict_one`` and its ``rank`` a sampled policy's ranking, each
        answering None where it leaves the work to Python; its ``make_room`` a put's first
        round of eviction for such a policy."""
        self.table = table
        self._evict = None if writer is None else writer.evict
        kind = fastpath.RANK_KINDS.get(table.config.policy)
        ranked_in_c = writer is not None and kind is not None
        raw = table.views.raw
        self._rank = partial(writer.rank, raw, kind) if ranked_in_c else None
        self._make_room = partial(writer.make_room, raw, kind) if ranked_in_c else None
        self.name = table.name
        self.config = table.config
        self._hq, self._hd = table.hq, table.hd
        self._eq = table.eq
        self._views = table.views
        self._allocator = table.allocator
        self._entries = table.entries
        self._policy = table.policy
        self._queues = table.queues
        self._clock = table.clock
        self._page_size = table.page_size
        self._procs = procs
        self._rng = rng
        self._remove = table.remove
        self._regret = table.regret
        self._free_entry = table.free_entry

    def make_room(
        self,
        num_pages: int,
        *,
        within_reserved: bool = False,
        recalled: int = -1,
    ) -> None:
        """Evict (expired entries first) until ``num_pages`` pages and a slot are free.

        Args:
            within_reserved: count only pages already backed with memory, for
                when the machine refused to back more (see ``Table.reserve``).
            recalled: the kind of the new key's ghost, or -1 (``QueuePolicy``).
        """
        if self.has_room(num_pages, within_reserved=within_reserved):
            return
        self.tidy(force=False)
        while not self.has_room(num_pages, within_reserved=within_reserved):
            victims, exact = self.choose_victims(recalled)
            if not victims.size:
                if self.reclaim_dead_writers():
                    continue
                raise PoolFullError(
                    f"pool '{self.name}' has no room: its space is held by values other "
                    "processes are still writing; retry, or create a larger pool"
                )
            for eid in victims.tolist():
                if self._eq[eid * ENTRY_WORDS + E.state] != READY:
                    continue  # drawn twice, or gone with an evicted parent
                # an exact victim is the queue policy's, which walked to its chunks just now
                queues = self._queues
                below = queues.take_descendants(eid) if queues is not None and exact else None
                self.evict_one(eid, below)
                if exact and self.has_room(num_pages, within_reserved=within_reserved):
                    return

    def room_for_put(self, key_bytes: bytes, num_pages: int) -> None:
        """What ``Table.reserve`` does before it takes pages, for a fresh put without a
        parent in a pool whose policy keeps no queues: a new key is a request for the
        regret sample, then room is made. The compiled put, told there is no room, calls
        this and tries again."""
        make_room = self._make_room
        if make_room is None or not self._first_round(make_room, key_bytes, num_pages):
            self.table.request(key_bytes)
        self.table.room(num_pages)

    def _first_round(
        self, make_room: Callable[..., list[int] | None], key_bytes: bytes, num_pages: int
    ) -> bool:
        """``room_for_put``'s request and first round of eviction, in one compiled call (a
        sample drawn, ranked and its best evicted: what ``make_room`` does with the same
        random words), after a due tidy in ``make_room``'s order (the request, room?, the
        tidy); whether the request was made."""
        h = self._hq
        key: bytes | None = key_bytes
        if h[H.puts] >= h[H.next_sweep_puts]:
            self.table.request(key_bytes)
            if self.has_room(num_pages):
                return True
            self.tidy(force=False)
            key = None
        samples = self.config.eviction_samples
        top = sample_batch(h[H.num_live], samples)
        if not top or (key is None and self.has_room(num_pages)):
            return key is None
        words = self._rng.bit_generator.random_raw(samples * top)
        left = make_room(key, num_pages, words, top, self._clock())
        if left is None:
            return key is None
        for eid in left:  # from one whose words C would not follow: Python decides
            if self._eq[eid * ENTRY_WORDS + E.state] == READY:
                self.evict_one(eid)
        return True

    def has_room(self, num_pages: int, *, within_reserved: bool = False) -> bool:
        """Whether ``num_pages`` pages (backed already, ``within_reserved``) and a slot are
        free."""
        allocator = self._allocator
        available = allocator.num_reserved_available if within_reserved else allocator.num_available
        return available() >= num_pages and self._entries.has_free_slot()

    def choose_to_move(self, num_pages: int) -> list[tuple[int, int]]:
        """Entries (id, generation) whose move elsewhere would free ``num_pages`` pages and a
        slot, by the policy; expired entries are dropped first, never moved."""
        self.tidy(force=False)
        shortfall = num_pages - self._allocator.num_available()
        need_slot = not self._entries.has_free_slot()
        chosen: dict[int, int] = {}
        for _ in range(SPILL_ROUNDS):
            if shortfall <= 0 and not need_slot:
                break
            victims, _ = self.choose_victims()
            if not victims.size:
                break
            for eid in victims.tolist():
                base = eid * ENTRY_WORDS
                if eid in chosen:
                    continue
                chosen[eid] = self._eq[base + E.generation]
                shortfall -= self._eq[base + E.num_pages]
                need_slot = False
                if shortfall <= 0:
                    break
        return list(chosen.items())

    def evict_one(self, eid: int, below: list[int] | None = None) -> int:
        """Evict a READY entry (with its descendants, where the policy tracks prefixes: ``below``,
        where the caller walked to them in this hold of the lock); how many went."""
        if self._evict is not None and self._evict(self._views.raw, eid, self._clock()):
            return 1
        chain = self.table.chain(eid, below)
        self._regret.evict(chain, self._clock())
        removed = self._remove(eid, chain)
        self._hq[H.evictions] += removed
        return removed

    def choose_victims(self, recalled: int = -1) -> tuple[np.ndarray, bool]:
        """Victims best first, and whether they are exact (evict only as many as needed)."""
        if self._queues is not None and self._hq[H.num_live]:
            self.table.drain_deferred()
            policy = cast(QueuePolicy, self._policy)
            eid = policy.victim(self._queues, recalled)
            if eid < 0:  # the tail (checked live) of an empty list that the counts call full
                raise corrupt("queue lists: the policy's victim list is empty")
            return np.array([eid]), True
        live = self._views.live[: self._hq[H.num_live]]
        return choose_victims(
            self._policy,
            self._views.entries,
            live,
            self.score_context(),
            self.config.eviction_samples,
            self._rng,
            self._rank,
            native.draw,
        )

    def rank_all(self) -> list[tuple[int, int]]:
        """Every live entry as (id, generation), best victim first."""
        self.table.drain_deferred()
        ids = self._entries.live_ids()
        records = self._views.entries[ids]
        order = rank_victims(self._policy, records, self.score_context())
        return list(zip(ids[order].tolist(), records["generation"][order].tolist(), strict=True))

    def score_context(self) -> ScoreContext:
        h = self._hq
        return ScoreContext(
            h[H.clock],
            self._clock(),
            self.config.lfu_half_life,
            h[H.num_live],
            h[H.num_probation],
            self._hd[H.probation_target],
        )

    def tidy(self, *, force: bool) -> int:
        """Reclaim what no one can use any more: expired entries and dead writers' pages.

        Both need a scan of the whole entry table (vectorised), so unforced
        tidies are spaced at least ``num_live / SWEEP_SPACING`` puts apart:
        with entries expiring continuously, a scan per put would make puts
        O(entries). Between tidies an expired entry is still never returned,
        and ranks first whenever an eviction sample meets it.

        Returns:
            the entries expired.
        """
        h = self._hq
        if not force and h[H.puts] < h[H.next_sweep_puts]:
            return 0
        h[H.next_sweep_puts] = h[H.puts] + h[H.num_live] // SWEEP_SPACING
        self.reclaim_dead_writers()
        return self.sweep_expired(force=force)

    def sweep_expired(self, *, force: bool) -> int:
        """Remove every expired entry, if forced or if one may have expired; how many."""
        now = self._clock()
        if not force and self._hd[H.next_expiry_at] > now:
            return 0
        records = self._views.entries[: self._hq[H.next_fresh_entry]]
        ready = records["state"] == READY
        expired = np.flatnonzero(ready & (records["expires_at"] <= now))
        num_expired = 0
        for eid in expired.tolist():
            if records["state"][eid] == READY:  # not gone with an expired parent
                num_expired += self._remove(eid)
        self._hq[H.expirations] += num_expired
        remaining = records["expires_at"][records["state"] == READY]
        self._hd[H.next_expiry_at] = float(remaining.min()) if remaining.size else math.inf
        return num_expired

    def reclaim_dead_writers(self) -> int:
        """Free WRITING entries whose writer died mid-copy; return how many."""
        records = self._views.entries[: self._hq[H.next_fresh_entry]]
        reclaimed = 0
        for eid in np.flatnonzero(records["state"] == WRITING).tolist():
            base = eid * ENTRY_WORDS
            owner = self._eq[base + E.owner_slot], self._eq[base + E.owner_serial]
            if not self._procs.is_live(*owner):
                self._free_entry(eid)
                reclaimed += 1
        return reclaimed
