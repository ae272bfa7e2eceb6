"""The one exception hierarchy of kvcache.

Every error a user can cause derives from :class:`KVCacheError`, and its message
says what to do next. Bad arguments are also :class:`ValueError` so that code
written against the standard library's conventions keeps working.

``reports_damage`` turns what damaged metadata makes Python raise deep inside
a pool operation (an index out of range, an overflow) into a
:class:`CorruptPoolError` at the API boundary, so no caller ever sees them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, cast


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


class DamagedValueError(CorruptPoolError):
    """A stored value's own bytes (its array header) do not decode: a verified pool drops
    the entry and misses, as for any checksum mismatch."""


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


class RemoteError(KVCacheError):
    """The remote tier (Redis / Valkey) cannot be used as asked: unreachable at create, or it
    refuses the credentials. Later failures are misses, never this error."""


class DependencyError(KVCacheError, ImportError):
    """An optional dependency (torch, transformers) is missing or of an unsupported version."""


Method = TypeVar("Method", bound=Callable[..., Any])
FOREIGN_ERRORS = (ArithmeticError, IndexError, ValueError)
"""What Python raises on metadata out of range: an id past a table (IndexError), a
clock past 2**63 (ValueError from a memoryview, OverflowError from a float), a key
that is not UTF-8 (UnicodeDecodeError, a ValueError)."""


DAMAGE_SIGNS = (CorruptPoolError, *FOREIGN_ERRORS)
"""What :func:`as_damage` looks at."""


REPAIR_ADVICE = "run kvcache health --repair"


def corrupt(detail: str) -> CorruptPoolError:
    """The error a layer that does not know the pool's name raises for damage it found."""
    return CorruptPoolError(f"{detail}: {REPAIR_ADVICE}")


def damaged(pool_name: str, detail: str) -> CorruptPoolError:
    """The error for pool metadata found out of range (``detail``: what was found)."""
    return CorruptPoolError(
        f"pool '{pool_name}' has damaged metadata ({detail}): "
        f"run kvcache health {pool_name} --repair"
    )


def reports_damage(method: Method) -> Method:
    """Make a pool method raise ``CorruptPoolError`` for what damaged metadata raises.

    Foreign errors become one, and one from a layer that does not know the
    pool (``codec``) gets its name and the advice to repair.

    Catching at the boundary costs nothing until something is raised, where
    checking every field on every call would slow every put and get. The
    pool lock leaves the pool marked dirty when such an error passes it, so
    the next holder rebuilds (see ``kvcache.lock``).
    """

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except DAMAGE_SIGNS as exc:
            raise_as_damage(self.name, exc)

    return cast(Method, guarded)


def raise_as_damage(pool_name: str, exc: BaseException) -> NoReturn:
    """Raise ``exc`` from a call on pool ``pool_name`` again, as the ``CorruptPoolError``
    that damage explains if it is a foreign error (or one without the advice).

    The hot paths (``Store.read``, ``Store.write``) call it from their own
    ``except`` rather than through :func:`reports_damage`, whose extra call
    frame cost 0.25 us (5% of a 4 KiB get); a ``try`` costs nothing until raised.
    """
    if isinstance(exc, CorruptPoolError):
        if "--repair" in str(exc):
            raise exc
        # from a layer that cannot say what to do (codec: a stored array header)
        raise damaged(pool_name, str(exc)) from exc
    if isinstance(exc, KVCacheError):  # InvalidArgument is a ValueError too
        raise exc
    raise damaged(pool_name, f"{type(exc).__name__}: {exc}") from exc
