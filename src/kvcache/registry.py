"""Where pools outside the shared-memory folder live: one small record per pool.

A disk pool is the file ``FOLDER/kvcache.<name>`` in a folder its creator
chose, so its name alone does not say where it is. The registry says::

    $KVCACHE_HOME/pools/            0700
        llama-disk                  0600, text: /var/cache/kvcache

One file per pool, holding the folder's absolute path, so that ``open``,
``destroy``, ``list_pools`` and every CLI verb find the pool by name. Records
are written to a temporary file, fsynced, then linked (a new pool: fails if
the name is recorded already, so two creates cannot both claim it) or renamed
(a restore that moves a pool) into place, and the folder is fsynced. Pools in
the shared-memory folder have no record: their name says where they are.

The registry is per user, as ``$KVCACHE_HOME`` is: another user's disk pool is
found only through a record of the caller's own (``kvcache.adopt``). A record
only says where to look; the pool file there is still checked (owner, format)
when it is opened.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from . import builds
from .errors import IncompatiblePoolError, PoolExistsError
from .home import kvcache_home
from .safepath import write_whole

MAX_RECORD_BYTES = 4096
"""A record is one path (PATH_MAX is 4096); anything longer is not a record."""


def registry_folder() -> Path:
    """``$KVCACHE_HOME/pools``: one record per pool outside the shared-memory folder."""
    return kvcache_home() / "pools"


def lookup(name: str) -> Path | None:
    """The folder recorded for pool ``name`` (already validated), or None if none is.

    Raises:
        IncompatiblePoolError: the record is not an absolute path (damaged).
    """
    record = registry_folder() / name
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None  # no record (one this user may not read is not this user's)
    try:
        text = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        folder = text.decode("utf-8")
    except UnicodeDecodeError:
        folder = ""
    if len(text) > MAX_RECORD_BYTES or not os.path.isabs(folder) or "\0" in folder:
        raise IncompatiblePoolError(
            f"the registry record {record} of pool '{name}' is damaged: "
            f"kvcache destroy {name} forgets it"
        )
    return Path(folder)


def claim(name: str, folder: Path) -> None:
    """Record that pool ``name`` lives in ``folder``, unless a record exists already.

    Raises:
        PoolExistsError: ``name`` is recorded (a disk pool of that name exists).
    """
    try:
        _write(name, folder, os.link)
    except FileExistsError:
        raise PoolExistsError(
            f"pool '{name}' already exists (a disk pool in {lookup(name)}): "
            "open it, or destroy it first"
        ) from None


def record(name: str, folder: Path) -> None:
    """Record (or move) pool ``name`` to ``folder``, replacing any record."""
    _write(name, folder, os.rename)


def forget(name: str) -> None:
    """Remove pool ``name``'s record, if there is one."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.unlink(registry_folder() / name)
        builds.fsync_folder(registry_folder())


def names() -> list[str]:
    """Names with a record (not checked: ``segment.list_names`` validates them)."""
    try:
        return [n for n in os.listdir(registry_folder()) if not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def _write(name: str, folder: Path, place: Callable[[Path, Path], None]) -> None:
    """Write ``folder`` as the record of ``name``, placed by ``place`` (link or rename)."""
    home = registry_folder()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_whole(home / name, os.fsencode(str(folder)), place=place)
    builds.fsync_folder(home)
