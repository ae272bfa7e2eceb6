"""Opening a pool by name, and following the chain its header and settings name.

``open_unchained`` turns a name into one open ``Pool`` (with the owner check,
and a retry when the name was swapped between opening the file and locking
it); ``follow_chain_of_top`` then gives it its tiers: the remote its settings
name (one ``RemoteLink`` for the whole chain, counted in the top pool's
header) and the lower pool its header names, opened the same way to any
depth, whose bottom pool demotes to that remote. The rest reads a pool's chain
from its header alone, without opening it (``chain_of``, ``check_chain``,
``upper_pools``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np

from . import owners, segment
from .errors import InvalidArgument, KVCacheError, PoolDestroyedError, PoolNotFoundError
from .layout import HEADER_DTYPE, PROMOTE_ON_HIT, read_header
from .pool import Pool
from .remote import RemoteLink, RemoteSpec
from .settings import NONE as NO_SETTINGS
from .settings import PoolSettings, read_settings
from .tiers import Below

T = TypeVar("T")

OPEN_ATTEMPTS = 3
"""An open that finds the pool destroyed or replaced between opening its file
and first locking it opens the name again (the new pool, or PoolNotFoundError);
only a name swapped under it this many times in a row is an error."""


@dataclass(frozen=True)
class Handles:
    """How the handles of one open are made, for every pool of its chain alike."""

    trust: owners.Trust
    verify_reads: bool | None = None  # None: every value read (see kvcache.open)
    clock: Callable[[], float] = time.time
    rng: np.random.Generator | None = None
    remote: RemoteLink | None = None  # the top pool's: the bottom one demotes to it
    observe: bool = False  # handles that take no process slot (see lifecycle.open)


def _open_chain(name: str, how: Handles, above: tuple[str, ...]) -> Pool:
    """Open ``name`` and the pools below it; ``above`` are the pools that lead here."""
    pool = open_unchained(name, how)
    _follow_chain(pool, how, above)
    return pool


def open_unchained(name: str, how: Handles) -> Pool:
    """Open pool ``name`` alone (no lower pool, no remote), as ``how`` says."""
    for _ in range(OPEN_ATTEMPTS - 1):
        try:
            return _open_once(name, how)
        except PoolDestroyedError:
            continue  # swapped between opening the file and locking it: look the name up again
    return _open_once(name, how)


def follow_chain_of_top(pool: Pool, how: Handles) -> None:
    """Attach the remote a pool opened by a caller names, then its chain of lower pools."""
    spec = stored_remote(pool)
    count = _ignore_counts if how.observe else pool.count_remote
    link = None if spec is None else RemoteLink(spec, count, max_entry_bytes=pool.config.size_bytes)
    if link is not None:
        pool.attach_remote(link, top=True, bottom=False)
    _follow_chain(pool, dataclasses.replace(how, remote=link), ())


def _ignore_counts(deltas: dict[str, int]) -> None:
    """An observer's remote counts: looking (``status`` pinging the remote) writes nothing
    to the pool, so a look during an outage adds no error to the alert being watched."""


def _follow_chain(pool: Pool, how: Handles, above: tuple[str, ...]) -> None:
    """Attach the lower pool the header names (opened now, and again if it goes away);
    the bottom pool of the chain demotes to the top pool's remote, if it has one."""
    target = stored_spill_to(pool)
    if target is None:
        if how.remote is not None:
            pool.attach_remote(how.remote, top=False, bottom=True)
        return
    chain = (*above, pool.name)

    def open_lower() -> Pool:
        if target in chain:
            raise InvalidArgument(
                f"pools {' -> '.join((*chain, target))} spill to each other in a cycle: "
                f"destroy '{target}' and create it again without --spill-to"
            )
        return _open_chain(target, how, chain)

    pool.attach_below(Below(target, open_lower))


class Link(NamedTuple):
    """A pool's chain: the lower pool its header names, and the settings this process
    follows (its remote tier and access log, :mod:`kvcache.settings`)."""

    spill_to: str | None = None  # the lower pool
    promote: int = PROMOTE_ON_HIT
    settings: PoolSettings = NO_SETTINGS


def stored_remote(pool: Pool) -> RemoteSpec | None:
    """The remote tier this process follows for ``pool`` (its settings), or None."""
    return read_settings(pool.path, pool.name).remote


def stored_spill_to(pool: Pool) -> str | None:
    """The lower pool named in ``pool``'s header, or None (none, or a damaged name)."""
    return _lower_pool(pool._segment)[0]


def _lower_pool(seg: segment.Segment) -> tuple[str | None, int]:
    """The lower pool a pool's header names (None: none, or a damaged name) and its
    promote mode. The header alone: the settings file is read only where it is needed."""
    header = np.ndarray((), HEADER_DTYPE, buffer=seg.buffer)
    try:
        raw, promote = header["spill_to"].item(), int(header["promote"])
    finally:
        del header  # no view may outlive a closing mapping
    try:
        lower = segment.validate_name(raw.decode("ascii")) if raw else None
    except (UnicodeDecodeError, InvalidArgument):
        lower = None  # damaged: the pool works on alone
    return lower, promote


def _spill_to_of(name: str) -> str | None:
    """The lower pool named in pool ``name``'s header; None if none or it cannot be read."""
    return _from_header(name, lambda seg: _lower_pool(seg)[0], None)


def chain_of(name: str) -> Link:
    """Pool ``name``'s link; an empty one if it names none or cannot be read."""
    return _from_header(
        name, lambda seg: Link(*_lower_pool(seg), read_settings(seg.path, name)), Link()
    )


def _from_header(name: str, read: Callable[[segment.Segment], T], default: T) -> T:
    """``read`` of pool ``name``'s mapped file; ``default`` if it cannot be opened or read.

    From the header alone: no process slot, lock or (for a disk pool) clean-close
    bookkeeping, as a full open would take, just to learn a few fixed fields.
    """
    try:
        seg = segment.attach(name, owners.TRUST_SELF)
    except KVCacheError:
        return default
    try:
        read_header(seg.buffer, seg.size_bytes, f"pool '{name}' ({seg.path})")
        return read(seg)
    except KVCacheError:
        return default
    finally:
        seg.close()


def check_chain(name: str, spill_to: str) -> None:
    """Refuse a lower pool ``spill_to`` for ``name`` that is missing or would close a cycle.

    Raises:
        InvalidArgument: ``spill_to`` is ``name``, or its chain leads back to ``name``.
        PoolNotFoundError: there is no pool ``spill_to``.
    """
    segment.validate_name(spill_to)
    if spill_to == name:
        raise InvalidArgument(
            f"pool '{name}' cannot spill to itself: name another pool with --spill-to"
        )
    if spill_to not in segment.list_names():
        raise PoolNotFoundError(
            f"no pool named '{spill_to}' to spill to: create it first "
            f"(kvcache create {spill_to} --size 100G --tier disk)"
        )
    chain, lower = [name, spill_to], _spill_to_of(spill_to)
    while lower is not None and lower not in chain[1:]:
        if lower == name:
            raise InvalidArgument(
                f"pool '{name}' cannot spill to '{spill_to}': "
                f"{' -> '.join((*chain, lower))} would be a cycle"
            )
        chain.append(lower)
        lower = _spill_to_of(lower)


def upper_pools(name: str) -> list[str]:
    """The pools whose header names ``name`` as their lower pool."""
    return [
        other for other in segment.list_names() if other != name and _spill_to_of(other) == name
    ]


def _open_once(name: str, how: Handles) -> Pool:
    seg = segment.attach(name, how.trust)
    try:
        config, geometry = read_header(seg.buffer, seg.size_bytes, f"pool '{name}' ({seg.path})")
        return Pool(
            seg,
            config,
            geometry,
            verify_reads=how.verify_reads,
            observe=how.observe,
            clock=how.clock,
            rng=how.rng,
        )
    except BaseException:
        seg.close()
        raise
