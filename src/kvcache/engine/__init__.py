"""The engine: one segment's entries, and the interface a compiled core would implement.

Its parts, each a module read in a sitting, joined in ``store``::

    Store     (store.py)     the interface: read / write / delete / contains,
      |                      repair; takes the lock, copies values
      +-- Table   (table.py)     the entry table under the lock: find, lookup,
      |                          reserve, publish, remove (index, allocator, policy
      |                          queues and prefix tree kept in step)
      +-- Evictor (eviction.py)  room for puts: expiry sweeps, dead writers, the
                                 policy's victims
    whole.py    whole entries in and out (locate, read_entry, confirm, write_entry,
                remove_entry, victims_to_move): snapshots and moves between tiers
    upkeep.py   explicit eviction, check, listings and counters over a Store
    closing.py  close (every part swapped for a closed stand-in) and a forked child's slot

Below it: ``segment`` (the mapped file), ``layout`` (the bytes inside), ``lock``,
``allocator``, ``index``, ``entries`` and ``policies``. Above it, ``Pool`` holds one
``Store`` and the chain of tiers; nothing here knows of tiers, remotes, access logs
or the command line.
"""

from .store import INLINE_COPY_MAX_BYTES, READ_ATTEMPTS, Store

__all__ = ["INLINE_COPY_MAX_BYTES", "READ_ATTEMPTS", "Store"]
