"""Closing a store, and a forked child's own hold on it.

A ``Store`` holds views of its mapping in every part (the table, the evictor,
the process table, the metrics region, the methods bound for the hot path);
the mapping cannot be unmapped while one is left. ``close`` gives up the
process slot, swaps every part for a stand-in that raises ``PoolClosedError``
on any use, and unmaps.
"""

from __future__ import annotations

from typing import NoReturn

from .. import durable
from ..errors import KVCacheError, PoolFullError
from ..lock import ClosedLock, closed_error
from .store import Store


def close(store: Store) -> None:
    """Give up ``store``'s process slot and its mapping; it is unusable after.

    The last handle of a disk pool flushes it and marks it clean first. Closing a closed
    store does nothing.
    """
    if isinstance(store.lock, ClosedLock):
        return
    try:
        if store.on_disk and not store.observing:
            _close_cleanly(store)
        with store.lock.closing() as lock_fd:
            if store.bytes_in or store.bytes_out:
                # after closing began, so that threads waiting for the lock are refused
                # while this waits for another process's hold, as they were before
                with store.lock.others_excluded():
                    store.add_kept_back()
            if store.slot >= 0:
                store.procs.leave(lock_fd, store.slot)
    finally:
        store.lock = ClosedLock(store.name)  # type: ignore[assignment]
        # Every part holds views of the mapping, which cannot be unmapped while one
        # is left; a closed stand-in makes any later use a PoolClosedError.
        closed = _Closed(store.name)
        for part in _PARTS:
            setattr(store, part, closed)
        store.views.release()
        store.segment.close()


def _close_cleanly(store: Store) -> None:
    """The last handle of a disk pool flushes it and marks it clean (``kvcache.durable``)."""
    try:
        if store.procs.others_live(store.slot):
            return
        store.segment.flush()  # the bulk of it without the lock
        with store.lock:
            marked = durable.on_close(store.segment, store.views.header_q, store.procs, store.slot)
        if marked:
            store.segment.flush_header()
    except (KVCacheError, OSError):
        pass  # destroyed, replaced, damaged or a failed write: unclean, the next open repairs


def after_fork(store: Store) -> None:
    """In a forked child: own a lock description and a process slot of its own.

    The inherited description is the parent's: through it the child would
    share the parent's flock (no exclusion between the two) and its slot's
    lease (the parent's entries would look alive while the child runs).
    """
    store.lock.reopen_after_fork()
    store.bytes_in = store.bytes_out = 0  # what the parent kept back is the parent's
    store.samples = []
    if store.observing:
        return
    try:
        store.slot, store.serial = store.procs.claim(store.lock.fd)
    except PoolFullError:
        store.slot = -1  # reads still work; write refuses with the reason
    store.table.owner = (store.slot, store.serial)
    store.lock.own(store.slot, store.serial)


_PARTS = (
    "table",
    "evictor",
    "procs",
    "metrics",
    "_hq",
    "_eq",
    "_lookup",
    "_value_views",
    "_summed",
    "_reserve",
    "_publish",
    "_entry_slices",
    "_free_entry",
    "_drop_damaged",
)
"""What ``close`` lets go of: everything that holds a view of the mapping."""


class _Closed:
    """Stands in for the parts of a closed store: any use raises ``PoolClosedError``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> NoReturn:
        raise closed_error(self._name)

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise closed_error(self._name)

    def __getitem__(self, index: object) -> NoReturn:
        raise closed_error(self._name)
