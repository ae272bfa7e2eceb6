"""A store's upkeep and reports: functions over ``Store``'s parts, each taking its lock.

Kept out of ``Store`` so that the engine's class holds the paths every put
and get takes, and these (eviction by request, checks, listings, counters,
the mapping operations beyond put/get/delete) read as what they are: short
procedures over the same lock, table and evictor. They batch their work
(``EVICT_BATCH`` removals per lock hold) so that no other process waits on
a whole pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .. import recovery, transfer
from ..counters import COUNTER_NAMES, M
from ..errors import InvalidArgument, PoolBusyError, PoolDestroyedError, damaged
from ..keys import Key, encode_key
from ..layout import COUNTERS, DESTROYED, ENTRY_WORDS, READY, REMOTE_COUNTERS, E, H
from ..policies import rank_victims
from ..procs import me
from ..reports import EntryInfo, EvictionResult, PoolMetrics, PoolStats
from ..units import parse_size, whole_number
from .eviction import EVICT_BATCH
from .store import READ_ATTEMPTS, Store

ENTRY_ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "lru": lambda r: r["last_access"],
    "size": lambda r: -(r["key_len"] + r["header_len"] + r["value_len"]),
    "priority": lambda r: r["priority"],
}
"""Sort keys of ``entries`` (ascending, ties by recency); ``policy`` ranks victims."""
ENTRY_SORTS = (*ENTRY_ORDERS, "policy")


# ---------------------------------------------------------------- eviction


def evict(
    store: Store,
    *,
    percent: float | None = None,
    bytes: str | int | None = None,
    expired: bool = False,
) -> EvictionResult:
    """``Pool.evict``: by the policy, expired entries first, ranking every entry exactly."""
    if (percent is not None) + (bytes is not None) + bool(expired) != 1:
        raise InvalidArgument("evict needs exactly one of percent=, bytes= or expired=True")
    if percent is not None and (
        isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 < percent <= 100
    ):
        raise InvalidArgument(f"percent must be a number in (0, 100], got {percent!r}")
    target_bytes = 0 if bytes is None else parse_size(bytes, what="bytes to evict")
    evictor, table, eq = store.evictor, store.table, store.table.eq
    with store.lock:
        held = table.held_bytes()
        num_expired = evictor.tidy(force=True)
        remaining = table.held_bytes()
        freed = held - remaining  # expired entries' and dead writers' pages and slots
        if percent is not None:
            target_bytes = math.ceil(remaining * percent / 100)
        if freed >= target_bytes:
            return EvictionResult(0, num_expired, freed)
        ranked = evictor.rank_all()
    num_entries = 0
    for start in range(0, len(ranked), EVICT_BATCH):
        with store.lock:
            for eid, generation in ranked[start : start + EVICT_BATCH]:
                if freed >= target_bytes:
                    break
                base = eid * ENTRY_WORDS
                if eq[base + E.generation] == generation and eq[base + E.state] == READY:
                    held, doomed = table.held_bytes(), table.chain(eid)
                    removed = evictor.evict_one(eid, doomed[:-1])
                    store.metrics.q[M.evictions_explicit] += removed
                    freed += held - table.held_bytes()
                    num_entries += removed
    return EvictionResult(num_entries, num_expired, freed)


def clear(store: Store) -> int:
    """Remove the entries there now, ``EVICT_BATCH`` per lock hold; how many went."""
    table = store.table
    with store.lock:
        ids = table.entries.live_ids()
        targets = list(
            zip(ids.tolist(), table.views.entries[ids]["generation"].tolist(), strict=True)
        )
    num_removed = 0
    for start in range(0, len(targets), EVICT_BATCH):
        with store.lock:
            for eid, generation in targets[start : start + EVICT_BATCH]:
                if table.is_ready(eid, generation):
                    num_removed += table.remove(eid)
    return num_removed


# ------------------------------------------------------------- mapping steps


def take(store: Store, key: Key) -> object | None:
    """Remove ``key``'s entry and return its value, or None: the value returned is the one
    removed (its generation is checked after the copy); counted as a read."""
    key_bytes, _ = encode_key(key)
    table = store.table
    for _ in range(READ_ATTEMPTS):
        with store.lock:
            eid = table.find(key_bytes)
            generation = table.eq[eid * ENTRY_WORDS + E.generation] if eid >= 0 else -1
        value = store.read(key, transfer.materialise)
        if value is None:
            return None
        with store.lock:
            if eid >= 0 and table.is_ready(eid, generation):
                table.remove(eid)
                return value
    return None


def any_key(store: Store) -> Key | None:
    """The key of some live entry, or None if there is none."""
    with store.lock:
        if not store.table.hq[H.num_live]:
            return None
        return store.table.key_of(int(store.views.live[0]))


def touch(store: Store, key: Key, ttl_s: float | None) -> bool:
    """Give ``key`` an expiry ``ttl_s`` from now (0 or None: never); whether it was there."""
    key_bytes, _ = encode_key(key)
    table = store.table
    with store.lock:
        eid = table.lookup(key_bytes, count=False)
        if eid < 0:
            return False
        expires_at = store.clock() + ttl_s if ttl_s else math.inf
        table.ed[eid * ENTRY_WORDS + E.expires_at] = expires_at
        # next_expiry_at is a lower bound (see sweep_expired): only an earlier expiry moves it
        if expires_at < table.hd[H.next_expiry_at]:
            table.hd[H.next_expiry_at] = expires_at
        return True


def expiry(store: Store, key: Key) -> float:
    """When ``key``'s entry expires (inf: never; -inf: no entry)."""
    key_bytes, _ = encode_key(key)
    table = store.table
    with store.lock:
        eid = table.find(key_bytes)
        return float(table.ed[eid * ENTRY_WORDS + E.expires_at]) if eid >= 0 else -math.inf


def keys(store: Store) -> list[Key]:
    """The keys of all live, unexpired entries now."""
    with store.lock:
        ids, _ = store.table.live_records()
        return [store.table.key_of(eid) for eid in ids.tolist()]


def num_live(store: Store) -> int:
    """The number of live entries, checked against the table's size."""
    with store.lock:
        count = store.table.hq[H.num_live]
    if not 0 <= count <= store.config.max_entries:  # len() would raise a ValueError
        raise damaged(store.name, f"live entry count {count}")
    return int(count)


# ---------------------------------------------------------------- reports


def entries(store: Store, sort: str = "lru", limit: int | None = None) -> list[EntryInfo]:
    """``Pool.entries``: live entries with their metadata, first the ones ``sort`` puts first."""
    if sort not in ENTRY_SORTS:
        raise InvalidArgument(f"unknown sort {sort!r}: choose one of {', '.join(ENTRY_SORTS)}")
    if limit is not None:
        whole_number(limit, "limit")
    table = store.table
    with store.lock:
        ids, records = table.live_records()
        if sort == "policy":
            order = rank_victims(table.policy, records, store.evictor.score_context())
        else:
            order = np.lexsort((records["last_access"], ENTRY_ORDERS[sort](records)))
        order = order[:limit]
        found = [table.key_of(eid) for eid in ids[order].tolist()]
    return [
        EntryInfo.from_record(key, record)
        for key, record in zip(found, records[order], strict=True)
    ]


def stats(store: Store) -> PoolStats:
    """``Pool.stats``: occupancy and counters as every attached process sees them."""
    h, mq, page_size = store.table.hq, store.metrics.q, store.table.page_size
    with store.lock:
        store.add_kept_back()
        counters = {name: h[getattr(H, name)] for name in COUNTERS}
        counters.update((name, mq[getattr(M, name)]) for name in COUNTER_NAMES)
        used, count = store.table.held_bytes(), h[H.num_live]
        attached = store.procs.live()  # under the lock: a close() may follow it at once
    here = me().pid_ns
    config = store.config
    return PoolStats(
        name=store.name,
        policy=config.policy,
        size_bytes=config.capacity_bytes,
        used_bytes=used,
        free_bytes=config.capacity_bytes - used,
        page_size_bytes=page_size,
        num_entries=count,
        max_entries=config.max_entries,
        attached=tuple(who.pid for who in attached if who.pid_ns == here),
        num_attached=len(attached),
        **counters,
    )


def metrics(store: Store, tier: str) -> PoolMetrics:
    """``Pool.metrics``: latency histograms and token counters, as every process sees them."""
    with store.lock:
        store.add_kept_back()
        region = store.metrics.read()
        regret = store.table.regret.read()
    return PoolMetrics.from_region(store.name, tier, region, regret)


def add_to_counters(store: Store, deltas: dict[int, int]) -> None:
    """Add to header counters (``layout.H`` word: amount), such as ``H.promotions``."""
    with store.lock:
        for word, delta in deltas.items():
            store.table.hq[word] += delta


def read_counters(store: Store, words: dict[str, int]) -> dict[str, int]:
    """The header counters ``words`` names (name: ``layout.H`` word), read under the lock."""
    with store.lock:
        return {name: int(store.table.hq[word]) for name, word in words.items()}


def reset_stats(store: Store) -> None:
    """Zero every counter and histogram, for every process."""
    with store.lock:
        store.bytes_in = store.bytes_out = 0
        h = store.table.hq
        for name in (*COUNTERS, *(f"remote_{name}" for name in REMOTE_COUNTERS)):
            h[getattr(H, name)] = 0
        store.metrics.reset(store.clock())
        store.table.regret.reset()


# ------------------------------------------------------------ check, retire


def check(store: Store, repair: bool = False) -> list[str]:
    """``Pool.check``: recount every invariant and every entry's checksum; what is wrong.

    Entries are summed one at a time without the lock (the lock is taken only
    to find each one and to confirm it did not change meanwhile).
    """
    with store.lock:
        problems, sound = recovery.inspect(store.recovery_parts())
        if repair and problems:
            store.repair()
    for eid in sound:
        key = _verify_entry(store, eid, remove=repair)
        if key is not None:
            problems.append(f"entry {eid} (key {key!r}): its bytes do not match their checksum")
    return problems


def _verify_entry(store: Store, eid: int, *, remove: bool) -> Key | None:
    """The key of READY entry ``eid`` if its bytes fail their checksum (removed if asked)."""
    table, base = store.table, eid * ENTRY_WORDS
    with store.lock:
        if table.eq[base + E.state] != READY:
            return None  # gone since the ids were read
        generation, summed = table.eq[base + E.generation], table.summed(eid)
    if summed.intact():
        return None
    with store.lock:
        if table.eq[base + E.generation] != generation:
            return None  # replaced or removed meanwhile: what was summed is no more
        key = table.key_of(eid)
        if remove:
            table.drop_damaged(eid)
        return key


def retire(store: Store, how: int, take_name: Callable[[], None], *, force: bool) -> bool:
    """Mark the store destroyed or replaced under its lock, after ``take_name`` takes its
    file's name; False if the file lost its name meanwhile (or another retire came first)."""
    try:
        with store.lock:
            if not store.segment.has_its_name():
                return False  # removed or replaced since it was opened: look it up again
            if not force:
                refuse_if_others_attached(store, "destroy" if how == DESTROYED else "replace")
            take_name()
            store.table.hq[H.retired] = how
            return True
    except PoolDestroyedError:
        return False  # another destroy or restore came first


def refuse_if_others_attached(store: Store, verb: str) -> None:
    """Raise :class:`PoolBusyError` if processes other than this one have the store open."""
    here = me()
    others = [who for who in store.procs.live() if who != here]
    if not others:
        return
    pids = [str(who.pid) for who in others if who.pid_ns == here.pid_ns]
    if len(pids) < len(others):  # their pids would name other processes here
        pids.append(f"{len(others) - len(pids)} in other PID namespaces")
    raise PoolBusyError(
        f"pool '{store.name}' is open in {len(others)} other process(es) "
        f"({', '.join(pids)}): close it there first, or pass --force (force=True) "
        f"to {verb} it anyway; their next call then fails with PoolDestroyedError"
    )
