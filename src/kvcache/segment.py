"""Shared-memory files: name checks, exclusive create, attach, reserve, unlink.

A pool is the file ``/dev/shm/kvcache.<name>`` (``$KVCACHE_SHM_DIR`` overrides
the folder), or ``FOLDER/kvcache.<name>`` for a pool created in another folder
(a disk pool), which ``registry`` records so that the name alone finds it:
:func:`segment_path` is the one lookup. A name is one pool across all folders.
``multiprocessing.shared_memory`` is not used: its resource
tracker unlinks segments when the creating process exits, and a pool must
outlive ``kvcache create``.

Creation builds the whole segment under a hidden temporary name and then
``link()``s it to the final name, which fails if the name exists: other
processes therefore see either no pool or a complete one, never a half-made
header, and a failed create leaves nothing behind. The builder holds a lease
on its hidden file until then (``builds``), so that ``create`` and
``list_names`` can remove the hidden files of builders that died.

Every reservation of memory is first checked against what the machine can
give (``memory.Room``): RAM, the cgroup's limit and the folder's free space
for a folder in RAM (tier ``cpu``), the disk's free space otherwise (``disk``).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import resource
import secrets
import stat
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from . import builds, memory, owners, registry
from .errors import (
    AddressSpaceError,
    IncompatiblePoolError,
    InvalidArgument,
    NotOwnerError,
    OutOfSharedMemoryError,
    PoolExistsError,
    PoolNotFoundError,
)
from .units import format_size

PREFIX = "kvcache."
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+; Python 3.13+ names it
MAX_NAME_CHARS = 100
DEFAULT_MODE = 0o600
"""Pools are private to their user unless the creator names a group (0o660)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z: "$" would accept a trailing newline
_HIDDEN = re.compile(r"^\.kvcache\.[A-Za-z0-9][A-Za-z0-9._-]*\.[0-9a-f]{12}\Z")
"""A pool being built: ``.kvcache.<name>.<12 hex digits>``."""
GROWTH_ADVICE = "evict, destroy unused pools, or free memory"
_MAP_ADVICE_CREATE = (
    "raise the limit (ulimit -v unlimited) or choose a smaller --size; nothing was created"
)
_MAP_ADVICE_OPEN = "raise the limit of the process that opens it (ulimit -v unlimited)"
RSS_BUDGET_BYTES = 256 << 20
"""A process's mapping of a disk pool drops its page-table entries (``MADV_DONTNEED``)
each time this many bytes were copied in or out through it, so its resident memory
stays bounded however large the pool (see :meth:`Segment.touched`)."""


def shm_dir() -> Path:
    """The folder that holds pool segments (``/dev/shm`` unless ``$KVCACHE_SHM_DIR``)."""
    return Path(os.environ.get("KVCACHE_SHM_DIR", "/dev/shm"))


def tier_of(folder: Path | None = None) -> str:
    """``cpu`` if pools in ``folder`` (default: :func:`shm_dir`) live in RAM, else ``disk``."""
    return "cpu" if memory.is_ram_backed(folder or shm_dir()) else "disk"


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe pool name, else raise :class:`InvalidArgument`.

    Names are 1-100 of letters, digits, ``.``, ``_`` and ``-``, starting with a
    letter or digit, so they can never leave the shared-memory folder.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument(
            f"pool name must be non-empty text such as 'llama-cache', not {name!r}"
        )
    if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
        raise InvalidArgument(
            f"pool name {name!r} is not allowed: use 1-{MAX_NAME_CHARS} letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (e.g. 'llama-cache')"
        )
    return name


def check_mode(mode: int, *, force: bool = False) -> int:
    """Return ``mode`` if it is safe permission bits for a pool file, else raise.

    Anyone who can read a pool reads its KV (from which prompts can be
    recovered); anyone who can write it makes every engine attached to it
    compute with poisoned values. So the owner must read and write, access
    for other users (neither owner nor group) needs ``force``, and execute
    bits are refused always: a pool is data, never a program.

    Raises:
        InvalidArgument: not permission bits 0..0o777, no read-write for the
            owner, execute bits, or access for other users without ``force``.
    """
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise InvalidArgument(f"mode must be permission bits such as 0o600, not {mode!r}")
    if mode & 0o111:
        raise InvalidArgument(
            f"mode {mode:#o} has execute bits, which a pool never needs: use e.g. 0o600 or 0o660"
        )
    if mode & 0o600 != 0o600:
        raise InvalidArgument(
            f"mode {mode:#o} does not let the owner read and write the pool: "
            "use e.g. 0o600 or 0o660"
        )
    if mode & 0o007 and not force:
        raise InvalidArgument(
            f"mode {mode:#o} lets every user on this machine read or write the pool's KV: "
            "use 0o660 to share with a group, or force it (--force, force=True)"
        )
    return mode


def segment_path(name: str) -> Path:
    """Where pool ``name`` lives: its registered folder, else the shared-memory folder."""
    folder = registry.lookup(validate_name(name))
    return (shm_dir() if folder is None else folder) / (PREFIX + name)


def is_taken(name: str) -> bool:
    """Whether ``name`` is a pool in any folder (registered, or a file in shared memory)."""
    return registry.lookup(name) is not None or os.path.lexists(shm_dir() / (PREFIX + name))


def list_names() -> list[str]:
    """Names of the pools in the shared-memory folder and in the registry, sorted.

    Hidden files of creates and restores whose process died are removed on the way
    (from the shared-memory folder; a create in another folder cleans that one).
    """
    try:
        files = os.listdir(shm_dir())
    except FileNotFoundError:
        files = []
    _remove_abandoned_builds(shm_dir(), files)
    names = {f[len(PREFIX) :] for f in files if f.startswith(PREFIX)} | set(registry.names())
    return sorted(name for name in names if _NAME.match(name) and len(name) <= MAX_NAME_CHARS)


class Segment:
    """One open, mapped pool file."""

    def __init__(self, name: str, path: Path, fd: int, size_bytes: int, *, advice: str) -> None:
        """Map ``fd``, which the caller still closes if this fails.

        Args:
            advice: what to do if this process cannot map that much.

        Raises:
            AddressSpaceError: the mapping does not fit this process's address space.
        """
        self.name = name
        self.path = path
        self.fd = fd
        self.size_bytes = size_bytes
        self.on_disk = not memory.is_ram_backed(path.parent)
        """Whether the file is on a disk (tier ``disk``) rather than in RAM (``cpu``)."""
        self._touched_bytes = 0
        try:
            self.buffer = mmap.mmap(
                fd, size_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
            )
        except OSError as exc:
            if exc.errno != errno.ENOMEM:
                raise
            raise AddressSpaceError(_unmappable(name, size_bytes, advice)) from exc

    @cached_property
    def room(self) -> memory.Room:
        """What the machine can give this pool (found out at the first reservation)."""
        return memory.Room(self.path.parent)

    def reserve(
        self, offset: int, length: int, *, populate: bool = False, advice: str = GROWTH_ADVICE
    ) -> None:
        """Back ``[offset, offset+length)`` with memory now, so later stores cannot SIGBUS.

        Args:
            populate: also map the range into this process now, in one call
                rather than one page fault per 4 KiB on first write (measured:
                1.6 -> 1.9 GB/s for first writes to fresh pages).
            advice: what to do if the machine cannot give the memory.

        Raises:
            NotEnoughMemoryError: the reservation would leave the machine (RAM,
                cgroup, folder) with less than its margin; nothing was reserved.
            OutOfSharedMemoryError: the shared-memory filesystem is full.
        """
        self.room.require(length, f"pool '{self.name}'", advice)
        self.allocate(offset, length)
        # A disk pool's pages are not prefaulted: they would count towards this
        # process's resident memory, which ``touched`` keeps bounded.
        if populate and not self.on_disk:
            start = offset - offset % mmap.PAGESIZE
            # Kernels before 5.14 refuse: pages then fault in one by one instead.
            with contextlib.suppress(OSError):
                self.buffer.madvise(MADV_POPULATE_WRITE, start, offset + length - start)

    def allocate(self, offset: int, length: int) -> None:
        """``posix_fallocate`` the range without the memory check (see :meth:`reserve`).

        Raises:
            OutOfSharedMemoryError: the folder's filesystem is full.
        """
        try:
            os.posix_fallocate(self.fd, offset, length)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT):
                raise
            enlarge = (
                "free disk space there" if self.on_disk else "mount -o remount,size=... /dev/shm"
            )
            raise OutOfSharedMemoryError(
                f"{self.path.parent} is full ({format_size(length)} more needed for pool "
                f"'{self.name}'): destroy unused pools, evict, or enlarge it ({enlarge})"
            ) from exc

    def touched(self, num_bytes: int) -> None:
        """Count bytes copied in or out of a disk pool's pages (cheap: safe under the lock)."""
        if self.on_disk:
            self._touched_bytes += num_bytes

    def shed(self) -> None:
        """Once ``RSS_BUDGET_BYTES`` were touched, unmap the pool from this process.

        ``MADV_DONTNEED`` on a shared file mapping drops only this process's
        page-table entries: dirty pages stay in the page cache and are written
        back as usual, and the next access maps them again (a minor fault, no
        I/O while they are cached). The page cache is the kernel's to reclaim,
        so a pool far larger than RAM never pins RAM. Call it without the pool
        lock: dropping 256 MiB of mappings took 5.4 ms here. A pool in RAM (tier
        ``cpu``) is never unmapped: its pages are RAM either way.
        """
        if self._touched_bytes >= RSS_BUDGET_BYTES:
            self._touched_bytes = 0
            with contextlib.suppress(ValueError):  # closed meanwhile by another thread
                self.buffer.madvise(mmap.MADV_DONTNEED)

    def will_need(self, offset: int, length: int) -> None:
        """Ask the kernel to read ``[offset, offset+length)`` of a disk pool in now, in one go.

        A cold value read through the mapping otherwise arrives one 4 KiB page
        fault at a time: measured on this machine's disk, a cold 1 MiB read took
        7.2-7.5 ms that way and 1.5-2.3 ms after ``MADV_WILLNEED`` (a plain
        ``pread``: 1.7 ms). It starts the reads and returns; a pool in RAM skips it.
        """
        start = offset - offset % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):  # advice only; ValueError: closed
            self.buffer.madvise(mmap.MADV_WILLNEED, start, offset + length - start)

    def flush(self) -> None:
        """Write every changed page of the file to its disk and wait (``msync`` + ``fsync``)."""
        self.buffer.flush()
        os.fsync(self.fd)

    def flush_header(self) -> None:
        """Write the header's page to its disk and wait (an ``msync`` of 4 KiB)."""
        self.buffer.flush(0, mmap.PAGESIZE)

    def has_its_name(self) -> bool:
        """Whether the pool's name still names this very file (not removed or replaced)."""
        try:
            named = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

    def close(self) -> None:
        """Unmap and close; the pool itself lives on."""
        try:
            self.buffer.close()
        except BufferError:
            pass  # a caller still holds a view (e.g. a numpy array): unmapped when it goes
        finally:
            os.close(self.fd)


def create(
    name: str,
    size_bytes: int,
    reserve_bytes: int,
    mode: int,
    initialise: Callable[[Segment], None],
    *,
    hidden: bool = False,
    folder: Path | None = None,
) -> Segment:
    """Create pool file ``name`` exclusively, reserve its first bytes and initialise it.

    Args:
        size_bytes: length of the file.
        reserve_bytes: leading bytes to back with memory now (metadata, or all).
        mode: permission bits, applied regardless of the umask.
        initialise: writes the header into the new mapping before it is published.
        hidden: leave the segment under its hidden temporary name until
            :func:`publish` (a restore fills it first); a failed create or an
            unpublished, discarded segment leaves no trace.
        folder: where the file goes (a checked folder, see ``folders.choose``);
            default the shared-memory folder. Another folder is recorded in
            the registry when the segment is published.

    Raises:
        PoolExistsError, OutOfSharedMemoryError, NotEnoughMemoryError, InvalidArgument,
        AddressSpaceError.
    """
    final = (shm_dir() if folder is None else folder) / (PREFIX + name)
    if not hidden and is_taken(name):
        raise _exists(name, segment_path(name))
    if not hidden and os.path.lexists(final):
        raise _exists(name, final)  # a pool file nobody registered: kvcache.adopt takes it in
    _check_capacity(final.parent, size_bytes, name)
    _remove_abandoned_builds(final.parent, os.listdir(final.parent))
    temp = final.parent / f".{PREFIX}{name}.{secrets.token_hex(6)}"
    try:
        fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileNotFoundError as exc:
        raise OutOfSharedMemoryError(
            f"{final.parent} does not exist: is /dev/shm mounted?"
        ) from exc
    segment = None
    try:
        builds.hold(fd)
        os.fchmod(fd, mode)
        os.ftruncate(fd, size_bytes)
        segment = Segment(name, temp, fd, size_bytes, advice=_MAP_ADVICE_CREATE)
        segment.reserve(0, reserve_bytes, advice=_create_advice(reserve_bytes == size_bytes))
        initialise(segment)
        if not hidden:
            publish(segment, replace=False)
    except BaseException:
        if segment is not None:
            segment.close()
        else:
            os.close(fd)
        temp.unlink(missing_ok=True)
        raise
    return segment


def publish(segment: Segment, *, replace: bool) -> None:
    """Give a segment created with ``hidden=True`` its pool name.

    Without ``replace`` this fails if the name is taken; with it, the old pool
    is replaced in one step (processes that have it open keep the old one).

    Raises:
        PoolExistsError: the name is taken and ``replace`` is False.
        NotOwnerError: the pool to replace belongs to another user.
    """
    name, folder = segment.name, segment.path.parent
    final = folder / (PREFIX + name)
    elsewhere = folder != shm_dir()  # recorded in the registry
    if replace:
        old = segment_path(name)
        if old != final and os.path.lexists(final):
            raise _exists(name, final)  # a file there that is not the pool being replaced
        try:
            os.rename(segment.path, final)
        except PermissionError as exc:
            _refuse_if_not_owner(final, f"replace pool '{name}'", exc)
            raise
        if elsewhere:
            registry.record(name, folder)
        else:
            registry.forget(name)
        if old != final:  # the pool moved to another folder: the old file goes
            old.unlink(missing_ok=True)
    else:
        if elsewhere:
            if os.path.lexists(shm_dir() / (PREFIX + name)):
                raise _exists(name, shm_dir() / (PREFIX + name))
            registry.claim(name, folder)
        elif registry.lookup(name) is not None:
            raise _exists(name, segment_path(name))
        try:
            os.link(segment.path, final)
        except FileExistsError as exc:
            if elsewhere:
                registry.forget(name)
            raise _exists(name, final) from exc
        except BaseException:
            if elsewhere:
                registry.forget(name)
            raise
        os.unlink(segment.path)
    segment.path = final
    builds.release(segment.fd)  # only now: until here a cleaner must see a live builder


def attach(name: str, trust: owners.Trust = owners.TRUST_SELF) -> Segment:
    """Open and map the existing pool file ``name``, if its owner is trusted.

    Raises:
        PoolNotFoundError, IncompatiblePoolError, InvalidArgument,
        NotOwnerError: another user's pool whose mode lets this user not even open it.
        UntrustedOwnerError: another user's pool that ``trust`` does not cover.
        AddressSpaceError: this process's ``ulimit -v`` is below the pool's size.
    """
    path = segment_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        if registry.lookup(name) is not None:
            raise PoolNotFoundError(
                f"pool '{name}' is registered in {path.parent} but {path} is gone: "
                f"kvcache destroy {name} forgets it"
            ) from exc
        raise PoolNotFoundError(
            f"no pool named '{name}': create it (kvcache create {name} --size 1G) "
            "or list pools (kvcache list)"
        ) from exc
    except PermissionError as exc:
        raise NotOwnerError(
            f"pool '{name}' belongs to another user{_owner_of(path)}, whose mode gives you no "
            "access: ask its owner for access, or use another pool name"
        ) from exc
    except IsADirectoryError as exc:
        raise IncompatiblePoolError(f"{path} is a directory, not a kvcache pool") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise IncompatiblePoolError(f"{path} is a symbolic link, not a kvcache pool") from exc
        raise
    info = os.fstat(fd)
    try:
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            raise IncompatiblePoolError(
                f"{path} is not a kvcache pool: remove it or pick another name"
            )
        trust.check(info, f"pool '{name}'")
    except BaseException:
        os.close(fd)
        raise
    try:
        return Segment(name, path, fd, info.st_size, advice=_MAP_ADVICE_OPEN)
    except BaseException:
        os.close(fd)
        raise


def _exists(name: str, path: Path) -> PoolExistsError:
    return PoolExistsError(f"pool '{name}' already exists ({path}): open it, or destroy it first")


def _owner_of(path: Path) -> str:
    """`` (NAME)``: who owns ``path``, for a message; empty if that cannot be told."""
    owner = owners.owner_name(path)
    return "" if owner is None else f" ({owner})"


def unlink(name: str) -> None:
    """Remove pool file ``name``; processes that have it mapped keep their mapping.

    Raises:
        PoolNotFoundError, IncompatiblePoolError, InvalidArgument,
        NotOwnerError: the pool belongs to another user.
    """
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError as exc:
        if registry.lookup(name) is not None:
            registry.forget(name)  # the file went first: forgetting it is all that is left
            return
        raise PoolNotFoundError(f"no pool named '{name}': see kvcache list") from exc
    except PermissionError as exc:
        _refuse_if_not_owner(segment_path(name), f"destroy pool '{name}'", exc)
        raise
    except IsADirectoryError as exc:
        raise IncompatiblePoolError(
            f"{segment_path(name)} is a directory, not a kvcache pool"
        ) from exc
    registry.forget(name)


def _unmappable(name: str, size_bytes: int, advice: str) -> str:
    """Why a pool could not be mapped: the address-space limit if there is one."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        why = "this process has no address space left for it (see vm.max_map_count)"
    else:
        why = (
            f"this process may map at most {format_size(limit)} in all "
            "(its address-space limit: ulimit -v, prlimit --as)"
        )
    return f"pool '{name}' needs {format_size(size_bytes)} of address space but {why}: {advice}"


def _refuse_if_not_owner(path: Path, action: str, denied: PermissionError) -> None:
    """Raise :class:`NotOwnerError` if ``action`` on ``path`` was ``denied`` for its owner.

    In a sticky folder (``/dev/shm`` is 1777) only a file's owner and root may
    remove or replace it. A denial for another reason (a folder the caller may
    not write) stays the caller's ``PermissionError``.
    """
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return
    if uid == os.geteuid():
        return
    owner = owners.user_name(uid)
    raise NotOwnerError(
        f"cannot {action}: it belongs to user {owner} (uid {uid}), and only its owner or "
        f"root may remove or replace it: ask {owner}, or use another pool name"
    ) from denied


def _create_advice(prealloc: bool) -> str:
    if prealloc:
        return "choose a smaller --size, or leave out --prealloc (then pages are reserved as used)"
    return "free memory (destroy unused pools, stop other processes)"


def _remove_abandoned_builds(folder: Path, files: list[str]) -> None:
    builds.remove_abandoned(folder / f for f in files if _HIDDEN.match(f))


def _check_capacity(folder: Path, size_bytes: int, name: str) -> None:
    try:
        fs = os.statvfs(folder)
    except FileNotFoundError as exc:
        raise OutOfSharedMemoryError(f"{folder} does not exist: is /dev/shm mounted?") from exc
    capacity = fs.f_blocks * fs.f_frsize
    if capacity and size_bytes > capacity:  # ramfs has no capacity (0): RAM is its limit
        raise OutOfSharedMemoryError(
            f"pool '{name}' needs {format_size(size_bytes)} but {folder} holds at most "
            f"{format_size(capacity)}: choose a smaller --size or "
            + (
                "enlarge /dev/shm (mount -o remount,size=... /dev/shm)"
                if memory.is_ram_backed(folder)
                else "another --path"
            )
        )
