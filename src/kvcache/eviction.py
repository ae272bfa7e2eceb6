"""Eviction: making room for puts, explicit evictions, expiry sweeps, dead writers.

A mixin of ``Pool`` (it works on the pool's own parts), kept apart so that
the pool module reads as the put/get paths. The policy chooses, this module
frees:

- ``_make_room`` runs on put when pages or an entry slot are short: first a
  spaced ``_tidy`` (expired entries, pages of writers that died), then victims
  from ``policies.choose_victims`` until the put fits. When the machine will
  not back more pages (a full /dev/shm, or the memory check), it runs again
  counting only the pages the pool already has: the pool stops growing and
  keeps serving puts by eviction.
- ``evict`` ranks every entry exactly and removes them in batches, releasing
  the lock between batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

import numpy as np

from .allocator import PageAllocator
from .config import PoolConfig
from .counters import M
from .entries import EntryTable
from .errors import InvalidArgument, OutOfSharedMemoryError, PoolFullError, reports_damage
from .layout import ENTRY_WORDS, READY, WRITING, E, H, Views
from .lock import PoolLock
from .policies import Policy, QueuePolicy, ScoreContext, choose_victims, rank_victims
from .procs import ProcessTable
from .queues import Queues
from .regret import RegretSample
from .reports import EvictionResult
from .sketch import admits
from .units import parse_size

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
"""Unforced tidies are at least num_live / 64 puts apart (see _tidy)."""


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


class EvictionMixin:
    """``Pool.evict`` and the room-making behind ``Pool.put``."""

    name: str
    config: PoolConfig
    _hq: memoryview
    _mq: memoryview  # the metrics region's words (kvcache.counters)
    _hd: memoryview[float]
    _eq: memoryview
    _views: Views
    _allocator: PageAllocator
    _entries: EntryTable
    _policy: Policy
    _procs: ProcessTable
    _lock: PoolLock
    _page_size: int
    _rng: np.random.Generator
    _clock: Callable[[], float]
    _queues: Queues | None  # Pool's: where the policy is a QueuePolicy
    _regret: RegretSample
    _ed: memoryview[float]

    def _remove(self, eid: int) -> int:
        raise NotImplementedError  # Pool's

    def _free_entry(self, eid: int) -> None:
        raise NotImplementedError  # Pool's

    @reports_damage
    def evict(
        self, *, percent: float | None = None, bytes: str | int | None = None, expired: bool = False
    ) -> EvictionResult:
        """Evict by the pool's policy, expired entries first.

        Give exactly one of: ``percent`` of the used bytes to free (0-100],
        ``bytes`` to free (``"100M"``), or ``expired=True`` to drop only expired
        entries. Unlike the sampling done on put, this ranks every entry.

        Raises:
            InvalidArgument: none or several targets, or a bad percent or size.
        """
        if (percent is not None) + (bytes is not None) + bool(expired) != 1:
            raise InvalidArgument("evict needs exactly one of percent=, bytes= or expired=True")
        if percent is not None and (
            isinstance(percent, bool)
            or not isinstance(percent, (int, float))
            or not 0 < percent <= 100
        ):
            raise InvalidArgument(f"percent must be a number in (0, 100], got {percent!r}")
        target_bytes = 0 if bytes is None else parse_size(bytes, what="bytes to evict")
        with self._lock:
            freed, num_expired = self._tidy(force=True)
            if percent is not None:
                target_bytes = math.ceil(self._hq[H.used_pages] * self._page_size * percent / 100)
            if freed * self._page_size >= target_bytes:
                return EvictionResult(0, num_expired, freed * self._page_size)
            ranked = self._rank_all()
        num_entries = 0
        for start in range(0, len(ranked), EVICT_BATCH):
            with self._lock:
                for eid, generation in ranked[start : start + EVICT_BATCH]:
                    if freed * self._page_size >= target_bytes:
                        break
                    base = eid * ENTRY_WORDS
                    if (
                        self._eq[base + E.generation] == generation
                        and self._eq[base + E.state] == READY
                    ):
                        used = self._hq[H.used_pages]
                        removed = self._evict_one(eid)
                        self._mq[M.evictions_explicit] += removed
                        freed += used - self._hq[H.used_pages]
                        num_entries += removed
        return EvictionResult(num_entries, num_expired, freed * self._page_size)

    def _make_room(
        self,
        num_pages: int,
        *,
        within_reserved: bool = False,
        candidate: float | None = None,
        recalled: int = -1,
    ) -> bool:
        """Evict (expired entries first) until ``num_pages`` pages and a slot are free; False
        if the policy would rather keep its first victim than admit the new entry.

        Args:
            within_reserved: count only pages already backed with memory, for
                when the machine refused to back more (see ``Pool._reserve``).
            candidate: the new entry's count in the policy's frequency sketch
                (policies that keep one), weighed against the first victim's.
            recalled: the kind of the new key's ghost, or -1 (``QueuePolicy``).
        """
        allocator, entries = self._allocator, self._entries
        available = allocator.num_reserved_available if within_reserved else allocator.num_available
        if available() >= num_pages and entries.has_free_slot():
            return True
        self._tidy(force=False)
        while available() < num_pages or not entries.has_free_slot():
            victims, exact = self._choose_victims(recalled)
            if candidate is not None and victims.size:
                if not admits(candidate, self._frequency(int(victims[0]))):
                    return False
                candidate = None  # one decision per put
            if not victims.size:
                if self._reclaim_dead_writers():
                    continue
                raise PoolFullError(
                    f"pool '{self.name}' has no room: its space is held by values other "
                    "processes are still writing; retry, or create a larger pool"
                )
            for eid in victims.tolist():
                if self._eq[eid * ENTRY_WORDS + E.state] != READY:
                    continue  # drawn twice, or gone with an evicted parent
                self._evict_one(eid)
                if exact and available() >= num_pages and entries.has_free_slot():
                    return True
        return True

    def _frequency(self, eid: int) -> float:
        """Entry ``eid``'s access count (its sketch count when last used), halved per
        ``lfu_half_life`` ticks idle since (``policies.base.decayed_frequency``)."""
        base = eid * ENTRY_WORDS
        idle = self._hq[H.clock] - self._eq[base + E.last_access]
        return self._ed[base + E.freq] * 2.0 ** (-idle / self.config.lfu_half_life)

    def _evict_one(self, eid: int) -> int:
        """Evict a READY entry (with its descendants, where the policy tracks prefixes); how
        many went."""
        self._regret.evict(eid, self._clock())
        removed = self._remove(eid)
        self._hq[H.evictions] += removed
        return removed

    def _choose_victims(self, recalled: int = -1) -> tuple[np.ndarray, bool]:
        """Victims best first, and whether they are exact (evict only as many as needed)."""
        if self._queues is not None and self._hq[H.num_live]:
            policy = cast(QueuePolicy, self._policy)
            return np.array([policy.victim(self._queues, recalled)]), True
        live = self._views.live[: self._hq[H.num_live]]
        return choose_victims(
            self._policy,
            self._views.entries,
            live,
            self._score_context(),
            self.config.eviction_samples,
            self._rng,
        )

    def _rank_all(self) -> list[tuple[int, int]]:
        """Every live entry as (id, generation), best victim first."""
        ids = self._entries.live_ids()
        records = self._views.entries[ids]
        order = rank_victims(self._policy, records, self._score_context())
        return list(zip(ids[order].tolist(), records["generation"][order].tolist(), strict=True))

    def _score_context(self) -> ScoreContext:
        h = self._hq
        return ScoreContext(
            h[H.clock],
            self._clock(),
            self.config.lfu_half_life,
            h[H.num_live],
            h[H.num_probation],
            self._hd[H.probation_target],
        )

    def _tidy(self, *, force: bool) -> tuple[int, int]:
        """Reclaim what no one can use any more: expired entries and dead writers' pages.

        Both need a scan of the whole entry table (vectorised), so unforced
        tidies are spaced at least ``num_live / SWEEP_SPACING`` puts apart:
        with entries expiring continuously, a scan per put would make puts
        O(entries). Between tidies an expired entry is still never returned,
        and ranks first whenever an eviction sample meets it.

        Returns:
            (pages freed by expiry, entries expired).
        """
        h = self._hq
        if not force and h[H.puts] < h[H.next_sweep_puts]:
            return 0, 0
        h[H.next_sweep_puts] = h[H.puts] + h[H.num_live] // SWEEP_SPACING
        self._reclaim_dead_writers()
        return self._sweep_expired(force=force)

    def _sweep_expired(self, *, force: bool) -> tuple[int, int]:
        """Remove every expired entry, if forced or if one may have expired."""
        now = self._clock()
        if not force and self._hd[H.next_expiry_at] > now:
            return 0, 0
        records = self._views.entries[: self._hq[H.next_fresh_entry]]
        ready = records["state"] == READY
        expired = np.flatnonzero(ready & (records["expires_at"] <= now))
        used, num_expired = self._hq[H.used_pages], 0
        for eid in expired.tolist():
            if records["state"][eid] == READY:  # not gone with an expired parent
                num_expired += self._remove(eid)
        freed = used - self._hq[H.used_pages]
        self._hq[H.expirations] += num_expired
        remaining = records["expires_at"][records["state"] == READY]
        self._hd[H.next_expiry_at] = float(remaining.min()) if remaining.size else math.inf
        return freed, num_expired

    def _reclaim_dead_writers(self) -> int:
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
