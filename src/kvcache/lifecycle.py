"""Named pools: create, open, destroy and list them (the module API over ``Pool``).

``pool`` is one open pool and what a handle does with it; this module is how
a name becomes a handle and how a name stops being a pool: exclusive create
(``segment.create``), open (``opening``: the owner check, a retry when the
name was swapped meanwhile, and the chain the pool names), and
destroy/replace, which mark the old segment retired for whoever still has it
open (``Pool._retire``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import durable, folders, owners, registry, segment
from .accesslog import log_spec
from .config import PoolConfig
from .errors import (
    CorruptPoolError,
    IncompatiblePoolError,
    InvalidArgument,
    PoolBusyError,
    PoolExistsError,
    PoolNotFoundError,
)
from .layout import (
    DESTROYED,
    PROMOTE_NEVER,
    PROMOTE_ON_HIT,
    REPLACED,
    Geometry,
    write_header,
)
from .opening import (
    OPEN_ATTEMPTS,
    Handles,
    check_chain,
    follow_chain_of_top,
    open_unchained,
    upper_pools,
)
from .policies import get_policy
from .pool import Pool
from .remote.reach import check_reachable, remote_spec
from .settings import NONE as NO_SETTINGS
from .settings import PoolSettings, remove_settings, write_settings

METADATA_ADVICE = "give fewer --max-entries or a smaller --inline-bytes, or free memory"
"""What to do where a new pool's metadata after its index cannot be backed with memory."""


def create(
    name: str,
    size: str | int,
    *,
    policy: str = "lru",
    page_size: str | int = "64K",
    max_entries: int | None = None,
    inline_bytes: str | int = 0,
    default_ttl: str | float | None = None,
    eviction_samples: int = 64,
    lfu_half_life: int | None = None,
    prealloc: bool = False,
    mode: int = segment.DEFAULT_MODE,
    force: bool = False,
    verify_reads: bool | None = None,
    spill_to: str | None = None,
    promote: str = "hit",
    tier: str = "cpu",
    path: str | os.PathLike[str] | None = None,
    remote: str | None = None,
    namespace: str | None = None,
    write_through: bool = False,
    remote_timeout: str | float | None = None,
    password_file: str | os.PathLike[str] | None = None,
    remote_key_file: str | os.PathLike[str] | None = None,
    access_log: str | os.PathLike[str] | None = None,
    access_log_size: str | int | None = None,
    clock: Callable[[], float] = time.time,
    rng: np.random.Generator | None = None,
) -> Pool:
    """Create pool ``name`` of ``size`` (``"16G"``) and open it.

    Args:
        policy: eviction policy, see ``kvcache.policies.POLICIES``.
        page_size: allocation unit, a power of two from 1K to 256M.
        max_entries: entry slots; default one per page (more with ``inline_bytes``).
        inline_bytes: give each entry slot an inline slot of this many bytes (a multiple
            of 64, at most half a page and 4K): an entry whose key, value header and
            value fit there takes no page, so small values are packed (``"128"``); the
            slots are reserved at create, ``max_entries`` times this many bytes.
        default_ttl: expiry for puts without a ttl (``"1h"``); default never.
        eviction_samples: entries scored per eviction (see ``PoolConfig``).
        lfu_half_life: clock ticks after which an idle LFU count halves.
        prealloc: reserve all memory now rather than as pages are first used.
        mode: file permissions; ``0o600`` keeps the pool private to its user,
            ``0o660`` shares it with the group; execute bits are refused.
        force: accept a ``mode`` that gives other users access (e.g. ``0o666``).
        verify_reads: whether this handle checks the values it reads: all (None,
            the default, or True) or none (False); see :func:`open`.
        spill_to: an existing pool that this one's evicted entries move to
            (see :mod:`kvcache.chain`); recorded in the pool, so every process
            that opens it follows the same chain.
        promote: what a hit in a lower pool does: ``"hit"`` moves the entry up
            into this pool, ``"never"`` leaves it below.
        tier: ``cpu`` (shared memory, /dev/shm) or ``disk`` (a file in a folder
            on a disk: no RAM limit, warm after a restart; see ``kvcache.durable``).
        path: the folder for the pool's file (must exist); default /dev/shm for
            ``cpu``, ``$KVCACHE_HOME/disk`` for ``disk`` (see ``kvcache.folders``).
        remote: a Redis / Valkey server or Cluster as the chain's last tier
            (``redis://host:6379/0``, ``rediss://``, ``unix:///path``,
            ``redis+cluster://h1:p1,h2:p2``; see :mod:`kvcache.remote`), shared
            by every host whose pool names it with the same ``namespace``.
        namespace: the remote keys' prefix (required with ``remote``).
        write_through: send every put to the remote at once (other hosts see it
            at once) rather than only what the local tiers evict.
        remote_timeout: a remote call slower than this (``"250ms"``, seconds)
            marks the remote down; default 0.25 s.
        password_file: a file holding the remote's password; without it the
            password comes from ``$KVCACHE_REDIS_PASSWORD`` (never from the URL).
        remote_key_file: a file holding a key (16-64 bytes, or their hex) that signs
            every remote record with keyed BLAKE2b; a record that fails it is a miss.
            Without it, whoever may write the namespace decides what every host reads.
        access_log: a file that every process using the pool appends its prefix
            requests to, for ``kvcache simulate`` (see :mod:`kvcache.accesslog`;
            ``Pool.set_access_log`` switches it later).
        access_log_size: the log's cap, with its one rotated file (default 64M).
        clock: injectable time (tests).
        rng: injectable randomness (tests).

    Raises:
        PoolExistsError: a pool of that name exists, in any folder.
        PoolNotFoundError: ``spill_to`` names no pool.
        RemoteError: the remote cannot be reached or refuses the password.
        OutOfSharedMemoryError: the folder cannot hold the pool.
        InvalidArgument: an argument is out of range.
        NotEnoughMemoryError: ``prealloc`` asks for more than the machine can give.
        AddressSpaceError: this process's ``ulimit -v`` is below the pool's size.
    """
    segment.validate_name(name)
    segment.check_mode(mode, force=force)
    folder = folders.choose(tier, path)
    promote_word = _promote_word(promote)
    if spill_to is not None:
        check_chain(name, spill_to)
    spec = remote_spec(
        remote, namespace, write_through, remote_timeout, password_file, remote_key_file
    )
    if access_log_size is not None and access_log is None:
        raise InvalidArgument("--access-log-size needs --access-log FILE")
    logged = None if access_log is None else log_spec(access_log, access_log_size)
    if spec is not None:
        check_reachable(spec)
    config = PoolConfig.build(
        size,
        page_size=page_size,
        policy=policy,
        max_entries=max_entries,
        default_ttl=default_ttl,
        eviction_samples=eviction_samples,
        lfu_half_life=lfu_half_life,
        inline_bytes=inline_bytes,
    )
    pool = create_from_config(
        name,
        config,
        mode=mode,
        prealloc=prealloc,
        verify_reads=verify_reads,
        spill_to=spill_to or "",
        promote=promote_word,
        settings=PoolSettings(spec, logged),
        clock=clock,
        rng=rng,
        folder=folder,
    )
    follow_chain_of_top(pool, Handles(owners.TRUST_SELF, verify_reads, clock, rng))
    return pool


def create_from_config(
    name: str,
    config: PoolConfig,
    *,
    mode: int = 0o600,
    prealloc: bool = False,
    verify_reads: bool | None = None,
    spill_to: str = "",
    promote: int = PROMOTE_ON_HIT,
    settings: PoolSettings = NO_SETTINGS,
    clock: Callable[[], float] = time.time,
    rng: np.random.Generator | None = None,
    hidden: bool = False,
    folder: Path | None = None,
) -> Pool:
    """Create and open pool ``name`` with a validated ``config`` (see :func:`create`).

    Args:
        spill_to, promote: the lower pool, written into the header (see :func:`create`;
            this opens neither the lower pool nor the remote).
        settings: the remote tier and access log, written to the pool's settings file
            (:mod:`kvcache.settings`) once it has its name; a hidden pool's are
            written by whoever publishes it.
        hidden: keep the segment under a hidden name until
            :func:`publish` (or :func:`discard`); a restore fills it first.
        folder: a folder from ``folders.choose``; default shared memory.
    """
    geometry = Geometry.for_config(config)

    def initialise(seg: segment.Segment) -> None:
        if not prealloc:  # the metadata after the index: what the pool's policy will write
            uses_queues = get_policy(config.policy).uses_queues
            for offset, length in geometry.metadata_after_index(uses_queues):
                seg.reserve(offset, length, advice=METADATA_ADVICE)
        write_header(
            seg.buffer,
            config,
            geometry,
            clock(),
            geometry.num_pages if prealloc else 0,
            spill_to=spill_to,
            promote=promote,
        )
        durable.mark_new(seg)

    reserve = geometry.total_bytes if prealloc else geometry.ghost_offset
    seg = segment.create(
        name, geometry.total_bytes, reserve, mode, initialise, hidden=hidden, folder=folder
    )
    try:
        if not hidden:
            write_settings(seg.path, settings, mode)
        return Pool(seg, config, geometry, verify_reads=verify_reads, clock=clock, rng=rng)
    except BaseException:
        seg.close()
        if hidden:
            seg.path.unlink(missing_ok=True)
        raise


def open(
    name: str,
    *,
    verify_reads: bool | None = None,
    trust_owner: str | int | None = None,
    trust_group: bool = False,
    chain: bool = True,
    observe: bool = False,
    clock: Callable[[], float] = time.time,
    rng: np.random.Generator | None = None,
) -> Pool:
    """Open the existing pool ``name`` (created by any process).

    Args:
        verify_reads: check each value read against the checksum written with
            it; a damaged entry is dropped, counted (``stats().damaged``) and read
            as a miss. None, the default, and True check every value (about a
            tenth of a read, summed in the pass that copies it); True also sums
            entries moved whole (persist, tier moves) on their way out; False
            checks none (see docs/performance.md). Disk pools check every value
            whatever this says.
        trust_owner: also accept a pool owned by this user (name or uid), e.g. a
            colleague's pool shared with ``mode=0o660``. Pools of other users
            are refused by default: their owner can read and change every value
            (see :mod:`kvcache.owners`). Root's pools are always accepted.
        trust_group: also accept a pool whose file group is one of the caller's.
        chain: also open the pools below it and connect to its remote tier; False
            opens the pool alone (its reads and writes stay in it), for reading its
            counters without a connection per look (``kvcache.metrics``).
        observe: open it (and its chain) to look, not to work: the handle takes
            no process slot, so it is not counted as attached and never makes a
            ``destroy`` refuse; it may read but not store, and changes nothing
            when it opens or closes (``kvcache status``, the exporter).
        clock: injectable time (tests).
        rng: injectable randomness (tests).

    Raises:
        PoolNotFoundError: no pool of that name.
        IncompatiblePoolError: the file is not a pool this kvcache can open.
        InvalidArgument: an argument is out of range.
        UntrustedOwnerError: another user's pool, and neither trust option covers it.
        AddressSpaceError: this process's ``ulimit -v`` is below the pool's size.
    """
    trust = owners.Trust.build(trust_owner, trust_group)
    how = Handles(trust, verify_reads, clock, rng, observe=observe)
    pool = open_unchained(name, how)
    if chain:
        follow_chain_of_top(pool, how)
    return pool


def _promote_word(promote: str) -> int:
    words = {"hit": PROMOTE_ON_HIT, "never": PROMOTE_NEVER}
    if promote not in words:
        raise InvalidArgument(f"promote must be 'hit' or 'never', not {promote!r}")
    return words[promote]


def destroy(
    name: str,
    *,
    force: bool = False,
    trust_owner: str | int | None = None,
    trust_group: bool = False,
) -> None:
    """Remove pool ``name``.

    Refused while other processes have it open, unless ``force``: they would go
    on storing work into a file nobody else can find. Forced, each of them fails
    its next call with :class:`PoolDestroyedError` (its memory is freed once
    they have all closed it); so do the handles of this process, which do not
    count as others. A file under the name that this kvcache cannot open as a
    pool (damaged, another format version) is removed as it is.

    A pool that other pools spill to is refused too, unless ``force``: those
    pools then drop what they evict (their chain is cut until a pool of that
    name exists again).

    Args:
        force: destroy it even while other processes have it open, or while
            other pools spill to it.
        trust_owner: destroy this other user's pool (see :func:`open`).
        trust_group: destroy a pool whose group is one of yours (see :func:`open`).

    A registered disk pool whose file is gone is forgotten.

    Raises:
        PoolNotFoundError: no pool of that name.
        PoolBusyError: other processes have it open, and ``force`` is not given.
        UntrustedOwnerError: another user's pool, and neither trust option covers it.
        InvalidArgument: the name is not a pool name.
    """
    segment.validate_name(name)
    uppers = [] if force else upper_pools(name)
    if uppers:
        raise PoolBusyError(
            f"pools {', '.join(repr(u) for u in uppers)} spill to pool '{name}': destroy them "
            "first, or pass --force (force=True) to destroy it anyway "
            "(they then drop what they evict)"
        )
    try:
        retire(
            name,
            DESTROYED,
            lambda: _unlink(name),
            force=force,
            trust_owner=trust_owner,
            trust_group=trust_group,
        )
    except PoolNotFoundError:
        if registry.lookup(name) is None or os.path.lexists(segment.segment_path(name)):
            raise
        registry.forget(name)  # only the record was left


def _unlink(name: str) -> None:
    """Remove pool file ``name`` and its settings."""
    path = segment.segment_path(name)
    segment.unlink(name)
    remove_settings(path)


def retire(
    name: str,
    how: int,
    take_name: Callable[[], None],
    *,
    force: bool = False,
    trust_owner: str | int | None = None,
    trust_group: bool = False,
) -> None:
    """Let ``take_name`` unlink pool ``name``'s file or rename another over it, and mark
    the old segment ``how`` (``layout.DESTROYED`` or ``REPLACED``) for whoever has it open.

    Both happen under the old pool's lock, after checking (unless ``force``)
    that no other process has it open. A process that opens the pool meanwhile
    claims its process slot before it first locks, so it is either counted or
    finds the mark and opens the name again.

    Raises:
        PoolNotFoundError: there is no pool ``name`` (``take_name`` was not called).
        PoolBusyError: other processes have it open and ``force`` is False.
        UntrustedOwnerError: another user's pool, not covered by the trust options.
    """
    trust = owners.Trust.build(trust_owner, trust_group)
    for _ in range(OPEN_ATTEMPTS):
        try:
            old = open_unchained(name, Handles(trust))
        except (IncompatiblePoolError, CorruptPoolError):
            if _damaged_record(name):
                registry.forget(name)
                return
            take_name()  # no pool this kvcache can attach to, so nobody here to tell
            return
        with old:
            if old._retire(how, take_name, force=force):
                return
    raise PoolBusyError(f"pool '{name}' was replaced again and again meanwhile: try again")


def refuse_if_in_use(name: str, **trust: Any) -> None:
    """Raise PoolBusyError if processes other than this one have pool ``name`` open.

    A name with no pool this kvcache can open behind it is not in use (``publish``
    tells those cases apart).
    """
    gone = (PoolNotFoundError, IncompatiblePoolError, CorruptPoolError)
    with contextlib.suppress(*gone), open(name, **trust) as old:
        old._refuse_if_others_attached("replace")


def publish(built: Pool, *, replace: bool, force: bool = False, **trust: Any) -> None:
    """Give a pool made with ``create_from_config(hidden=True)`` its name.

    With ``replace``, an old pool of that name is retired (see :func:`retire`).

    Raises:
        PoolExistsError: the name is taken and ``replace`` is False.
        PoolBusyError, UntrustedOwnerError, NotOwnerError: see :func:`retire`.
    """
    seg = built._segment
    if not replace:
        segment.publish(seg, replace=False)
        return
    try:
        retire(seg.name, REPLACED, lambda: segment.publish(seg, replace=True), force=force, **trust)
    except PoolNotFoundError:
        if os.path.lexists(segment.segment_path(seg.name)):
            raise  # a file this process may not open: another user's pool
        segment.publish(seg, replace=True)  # nothing to replace (any more)


def discard(built: Pool) -> None:
    """Remove the hidden file of a pool made with ``hidden=True`` and never published."""
    built._segment.path.unlink(missing_ok=True)


def _damaged_record(name: str) -> bool:
    try:
        registry.lookup(name)
    except IncompatiblePoolError:
        return True
    return False


def list_pools() -> list[str]:
    """Names of all pools on this machine (in shared memory, and this user's registered
    pools in other folders), sorted."""
    return segment.list_names()


def adopt(name: str, path: str | os.PathLike[str]) -> None:
    """Register the existing pool file ``PATH/kvcache.<name>`` under ``name``.

    For a disk pool whose registry record was lost (a new ``$KVCACHE_HOME``),
    or a copy of a pool's file, placed under the new name in a folder of its
    own. The file is opened once to check it is a pool this kvcache reads (a
    copy taken while it was in use is repaired then, see ``kvcache.durable``).

    Raises:
        PoolExistsError: ``name`` is a pool already.
        PoolNotFoundError: no file ``kvcache.<name>`` in that folder.
        InvalidArgument: ``path`` is not a folder.
        IncompatiblePoolError, UntrustedOwnerError: the file is not a pool of yours.
    """
    segment.validate_name(name)
    folder = folders.matching(path)
    if segment.is_taken(name):
        raise PoolExistsError(
            f"pool '{name}' already exists: destroy it first, or adopt another name"
        )
    if not (folder / (segment.PREFIX + name)).is_file():
        raise PoolNotFoundError(
            f"no pool file {folder / (segment.PREFIX + name)}: give the folder that holds it"
        )
    registry.claim(name, folder)
    try:
        open(name).close()
    except BaseException:
        registry.forget(name)
        raise
