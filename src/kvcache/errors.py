"""The one exception hierarchy of kvcache.

Every error a user can cause derives from :class:`KVCacheError`, and its message
says what to do next. Bad arguments are also :class:`ValueError` so that code
written against the standard library's conventions keeps working.
"""

from __future__ import annotations


class KVCacheError(Exception):
    """Base class of every kvcache error."""


class InvalidArgument(KVCacheError, ValueError):
    """A size, name, key, value or option is not acceptable."""


class PoolNotFoundError(KVCacheError, FileNotFoundError):
    """No pool of that name exists."""


class PoolExistsError(KVCacheError, FileExistsError):
    """A pool of that name already exists."""


class PoolClosedError(KVCacheError):
    """The Pool object was closed; open the pool again to use it."""


class PoolDestroyedError(PoolClosedError):
    """The pool was destroyed, or replaced by a restore, while this handle had it open."""


class PoolBusyError(KVCacheError):
    """Other processes have the pool open, so destroying or replacing it needs ``force``."""


class UntrustedOwnerError(KVCacheError):
    """The pool or snapshot belongs to a user the caller did not say to trust.

    Not a ``PermissionError``: the operating system would allow the access; it
    is kvcache that refuses it (see ``kvcache.owners``).
    """


class NotOwnerError(KVCacheError, PermissionError):
    """Only the pool's owner (or root) may destroy it or replace it by a restore."""


class IncompatiblePoolError(KVCacheError):
    """The segment is not a kvcache pool, or was made by another format version."""


class CorruptPoolError(KVCacheError):
    """The pool's metadata breaks an invariant that repair could not mend."""


class PoolFullError(KVCacheError):
    """No room could be made: everything left is being written by live processes."""


class ValueTooLargeError(PoolFullError, InvalidArgument):
    """The value (with its key) is larger than the whole pool."""


class SnapshotError(KVCacheError):
    """A snapshot file is missing, unreadable, damaged or could not be written."""


class OutOfSharedMemoryError(KVCacheError, OSError):
    """The shared-memory filesystem (/dev/shm) has no room for the pool's pages."""


class NotEnoughMemoryError(OutOfSharedMemoryError):
    """Reserving a pool's memory would leave the machine, its cgroup or the folder short."""


class AddressSpaceError(KVCacheError, OSError):
    """This process may not map the whole pool: its address-space limit (ulimit -v) is too low."""


class DependencyError(KVCacheError, ImportError):
    """An optional dependency (torch, transformers) is missing or of an unsupported version."""
