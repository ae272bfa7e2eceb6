"""kvcache: LLM KV-cache pools in POSIX shared memory, shared by every process.

A pool is one file in ``/dev/shm`` that any number of processes map. Its
parts, bottom up (each module opens with its own overview):

- ``segment``   create/attach/unlink the file; names, permissions, reservation
- ``home``      the per-user kvcache folder ($KVCACHE_HOME)
- ``registry``  where pools outside /dev/shm (disk pools) live, by name
- ``folders``   a new pool's folder from its tier (cpu, disk) and path, checked
- ``owners``    whose pools and snapshots to trust (the caller's, root's, named ones)
- ``safepath``  opening files at given paths so no other user can steer the open
- ``memory``    what RAM, the cgroup and the folder can still give a reservation
- ``builds``    leases on files under construction; removing abandoned ones
- ``layout``    the binary layout: header, process table, entry table, live
                list, key index, page links, data pages
- ``leases``    kernel-held OFD byte-range locks: liveness in every PID namespace
- ``procs``     the attached-process table: one leased slot per open pool
- ``lock``      thread + process exclusion; detects holders that died
- ``allocator`` fixed-size pages chained per value: no fragmentation failures
- ``entries``   entry slots and the dense list of live entries
- ``keys``      key validation and the 128-bit hash the index files keys by
- ``index``     key hash -> entry, open addressing inside the segment
- ``policies``  eviction: scored (lru, lfu, fifo, priority, ttl, size, prefix) and queued
                (s3fifo, arc)
- ``queues``    the queued policies' lists and ghost ring inside the segment
- ``codec``     bytes and numpy arrays in and out of pages, never pickled
- ``recovery``  consistency check and repair from the entry table
- ``transfer``  bytes between callers' buffers and an entry's pages
- ``eviction``  making room on put, explicit evict, expiry and dead-writer sweeps
- ``durable``   disk pools: clean close, repair after an unclean stop
- ``stored``    whole entries as they move: ``EntryRef``, ``StoredEntry``
- ``tiers``     chains of pools: spill evicted entries down, promote hits below
- ``accesslog`` the opt-in, bounded log of prefix requests a pool's processes write
- ``settings``  a pool's remote tier and access log: its owner's file, never the pool's bytes
- ``pool``      ``Pool``: put/get/delete/evict/stats, wiring the above
- ``remote``    a Redis / Valkey server or Cluster as a chain's last tier, shared by hosts
- ``lifecycle`` create/open/destroy/list by name; retiring a pool others have open
- ``mapping``   ``Pool`` as a dict: pop, clear, touch, ttl, views others may change
- ``snapshot``  persist to a file and restore: format, atomic writes, checks
- ``prefix``    token prefixes: ``PrefixCache`` stores/finds a prompt's KV by chunks
- ``integrations`` Hugging Face transformers (``kvcache.integrations.transformers``)
- ``simulate``  capacity planning: a trace replayed per policy and size, beside OPT
- ``cli``       ``kvcache ...`` over the public API

Typical use::

    import kvcache
    pool = kvcache.create("llama-cache", size="1G", policy="lru")
    pool.put("prompt-42", kv_bytes, priority=5, ttl=600)
    other = kvcache.open("llama-cache")  # in any process
    other.get("prompt-42")
    kvcache.persist(pool)                # a snapshot file; kvcache.restore brings it back
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    AddressSpaceError,
    CorruptPoolError,
    DependencyError,
    IncompatiblePoolError,
    InvalidArgument,
    KVCacheError,
    NotEnoughMemoryError,
    NotOwnerError,
    OutOfSharedMemoryError,
    PoolBusyError,
    PoolClosedError,
    PoolDestroyedError,
    PoolExistsError,
    PoolFullError,
    PoolNotFoundError,
    RemoteError,
    SnapshotError,
    UntrustedOwnerError,
    ValueTooLargeError,
)

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports each on first use
    from .config import PoolConfig
    from .lifecycle import adopt, create, destroy, list_pools, open
    from .pool import Pool
    from .prefix import KVLayout, PrefixCache
    from .reports import EvictionResult, PoolStats, RemoteStats
    from .snapshot import (
        RestoreReport,
        SnapshotInfo,
        inspect_snapshot,
        persist,
        restore,
        restore_with_report,
    )
    from .units import format_size, parse_duration, parse_size

__version__ = "0.1.0"

__all__ = [
    "AddressSpaceError",
    "CorruptPoolError",
    "DependencyError",
    "EvictionResult",
    "IncompatiblePoolError",
    "InvalidArgument",
    "KVCacheError",
    "KVLayout",
    "NotEnoughMemoryError",
    "NotOwnerError",
    "OutOfSharedMemoryError",
    "Pool",
    "PoolBusyError",
    "PoolClosedError",
    "PoolConfig",
    "PoolDestroyedError",
    "PoolExistsError",
    "PoolFullError",
    "PoolNotFoundError",
    "PoolStats",
    "PrefixCache",
    "RemoteError",
    "RemoteStats",
    "RestoreReport",
    "SnapshotError",
    "SnapshotInfo",
    "UntrustedOwnerError",
    "ValueTooLargeError",
    "adopt",
    "create",
    "destroy",
    "format_size",
    "inspect_snapshot",
    "list_pools",
    "open",
    "parse_duration",
    "parse_size",
    "persist",
    "restore",
    "restore_with_report",
]

_LAZY = {
    "PoolConfig": "config",
    **dict.fromkeys(("adopt", "create", "destroy", "list_pools", "open"), "lifecycle"),
    "Pool": "pool",
    **dict.fromkeys(("KVLayout", "PrefixCache"), "prefix"),
    **dict.fromkeys(("EvictionResult", "PoolStats", "RemoteStats"), "reports"),
    **dict.fromkeys(
        (
            "RestoreReport",
            "SnapshotInfo",
            "inspect_snapshot",
            "persist",
            "restore",
            "restore_with_report",
        ),
        "snapshot",
    ),
    **dict.fromkeys(("format_size", "parse_duration", "parse_size"), "units"),
}
"""Where each public name lives. ``import kvcache`` loads none of them: a command that only
prints its version, or an engine that only needs ``PrefixCache``, does not pay for numpy
and every layer of ``Pool`` (about 200 ms when all of it was imported up front)."""


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error there

    def __getattr__(name: str) -> Any:
        """``kvcache.NAME`` on first use (PEP 562): a public name from its module, or a
        submodule (``kvcache.segment``), imported now and kept, so later uses are plain
        attribute reads."""
        module = _LAZY.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f".{module}", __name__), name)
        elif name.startswith("_"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        else:
            try:
                value = importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise  # the submodule exists; something it imports is missing
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
