"""Whole entries in and out of a store: for snapshots and for moves between tiers.

A snapshot writes out, and a chain moves down (spill) or up (promote), whole
entries: metadata and bytes together. Each move is in two halves, never holding
two stores' locks at once: ``read_entry`` gives an entry's metadata and views
of its bytes, to be copied without the lock and accepted only if ``confirm``
says it was still that entry (the readers' seqlock); ``write_entry`` stores an
entry whose bytes a ``fill`` copies, and ``remove_entry`` removes the source
once the copy is published. ``has_room`` and ``victims_to_move`` tell a chain
what to spill before the store would evict by dropping.

Functions over a ``Store`` rather than its methods, like ``upkeep``: they run
once per entry moved, not per put or get, and a compiled core may leave them
in Python over the same ``Table``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import transfer
from ..errors import reports_damage
from ..keys import Key, encode_key, key_hash
from ..layout import ENTRY_WORDS, E, H
from ..stored import EntryRef, StoredEntry
from .store import Fill, Store


def has_room(store: Store, num_pages: int) -> bool:
    """Whether ``num_pages`` pages and an entry slot are free now (read without the lock:
    a hint, such as whether moving entries elsewhere is worth the lock)."""
    return store.evictor.has_room(num_pages)


def victims_to_move(store: Store, num_pages: int) -> list[EntryRef]:
    """The entries the policy would evict for ``num_pages`` pages and a slot, to move
    elsewhere (a chain's spill) rather than drop; none is removed here."""
    with store.lock:
        chosen = store.evictor.choose_to_move(num_pages)
    return [EntryRef(eid, generation) for eid, generation in chosen]


@reports_damage
def live_entries(store: Store) -> tuple[int, np.ndarray, np.ndarray]:
    """The logical clock, and the ids and record copies (``layout.ENTRY_DTYPE``) of
    the live, unexpired entries; ``EntryRef(id, record["generation"])`` names one."""
    with store.lock:
        ids, records = store.table.live_records()
        return store.table.hq[H.clock], ids, records


@reports_damage
def read_entry(store: Store, ref: EntryRef) -> tuple[StoredEntry, list[memoryview]] | None:
    """The metadata of entry ``ref`` and views of its bytes (key | value header |
    payload), or None if it is no longer that READY entry.

    The views are read without the lock: whatever was copied from them counts
    only if :meth:`confirm` says so afterwards.
    """
    with store.lock:
        if not store.table.is_ready(*ref):
            return None
        checksum = transfer.from_word(store.table.eq[ref.eid * ENTRY_WORDS + E.checksum])
        record = store.views.entries[ref.eid]
        entry = StoredEntry.from_record(bytes(store.table.key_view(ref.eid)), record, checksum)
        return entry, store.table.entry_slices(ref.eid)


@reports_damage
def read_ahead(store: Store, keys: Sequence[Key]) -> None:
    """Ask the disk for the entries of ``keys`` all at once (nothing for a store in RAM)."""
    if not store.on_disk:
        return
    hashes = [key_hash(encode_key(key)[0]) for key in keys]
    with store.lock:
        found = [store.table.index.find(lo, hi) for lo, hi in hashes]
        spans = [span for eid in found if eid >= 0 for span in store.table.file_spans(eid)]
    for offset, length in spans:  # each asks the disk: outside the lock
        store.segment.will_need(offset, length)


@reports_damage
def locate(store: Store, key: Key) -> EntryRef | None:
    """The entry under ``key``, looked up as a read does (a hit or a miss in stats)."""
    key_bytes, _ = encode_key(key)
    with store.lock:
        eid = store.table.lookup(key_bytes, count=True, read_ahead=store.on_disk)
        if eid < 0:
            return None
        base = eid * ENTRY_WORDS
        value_len = store.table.eq[base + E.value_len]
        if value_len > store.table.data.nbytes:  # damaged: never counted into the metrics
            raise ValueError(f"entry {eid}'s value length {value_len} is past the pool's pages")
        store.bytes_out += value_len  # kept back, as a read's
        return EntryRef(eid, store.table.eq[base + E.generation])


@reports_damage
def remove_entry(store: Store, ref: EntryRef, *, count_as: int = -1) -> bool:
    """Remove entry ``ref`` if it is still that entry; whether it was.

    ``count_as``: a header counter (``layout.H``) to add one to if it was, such as
    ``H.spills`` for an entry moved down a chain.
    """
    with store.lock:
        if not store.table.is_ready(*ref):
            return False
        store.table.remove(ref.eid)
        if count_as >= 0:
            store.table.hq[count_as] += 1
        return True


@reports_damage
def confirm(store: Store, ref: EntryRef, entry: StoredEntry, views: list[memoryview]) -> bool:
    """Whether the bytes copied from ``views`` (:meth:`read_entry`'s) are entry ``ref``'s.

    False if the entry changed meanwhile; with ``verify_reads=True`` (or on disk),
    also if its bytes fail their checksum (summed here, without the lock), in
    which case the damaged entry is dropped and counted.
    """
    intact = not store.verify_moves or entry.checksum == transfer.checksum(
        views, entry.flags, len(entry.key), entry.header_len, entry.value_len
    )
    with store.lock:
        if not store.table.is_ready(*ref):
            return False
        if not intact:
            store.table.drop_damaged(ref.eid)
        return intact


def write_entry(
    store: Store,
    entry: StoredEntry,
    fill: Fill,
    *,
    keep_history: bool = False,
    replace: bool = True,
    evict_within_reserved: bool = True,
) -> bool:
    """Store ``entry``, whose bytes ``fill`` copies into the views it is given.

    ``fill`` runs without the lock and returns the checksum to publish
    (``entry.checksum`` for an intact copy), or None to refuse the entry.
    Returns whether the entry was published.

    Args:
        keep_history: keep ``entry``'s policy history (a restore on the
            snapshot's clock) rather than starting it afresh.
        replace: replace an entry of the same key; False leaves one that
            appeared meanwhile in place (a promotion never overwrites a newer put).
        evict_within_reserved: see ``Table.reserve``.

    Raises:
        ValueTooLargeError: the entry is larger than the whole pool.
    """
    store.refuse_too_large(entry.num_bytes)
    return store.write(
        entry.key,
        entry.flags,
        entry.header_len,
        entry.value_len,
        entry.priority,
        entry.expires_at,
        fill,
        history=(entry.created, entry.last_access, entry.freq) if keep_history else None,
        replace=replace,
        evict_within_reserved=evict_within_reserved,
    )


@reports_damage
def set_clock(store: Store, clock: int) -> None:
    """Set the logical clock (a restore puts back the snapshot's)."""
    with store.lock:
        store.table.hq[H.clock] = clock
