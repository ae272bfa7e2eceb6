"""A pool's settings that make a process reach outside it: its remote tier and access log.

They live in a file of the pool's owner beside the pool, never in the pool::

    /dev/shm/kvcache.NAME              the pool: 0600, or 0660 to share with a group
    /dev/shm/.kvcache-settings.NAME    its settings: JSON, the owner's, 0600 (0640 shared)

Whoever may write a pool may write its header: with mode 0660 that is every
member of its group. A URL or a path read from there would be an instruction
from them, run by every process using the pool as its own user (append to a
file they chose, send a password to a server they run). So a process follows
a settings file only if it is a regular file of its own user or of root that
no one else may write (:mod:`kvcache.safepath`); another user's settings are
ignored (logged once), and that process uses the pool without a remote tier
or access log. What a group member may change is what it stores and reads.

The pool's header keeps a ``settings_serial`` that a change bumps, so open
handles read the file again; anyone who may write the pool can bump it, which
costs a read and changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accesslog import MIN_MAX_BYTES, AccessLog, LogSpec, log_spec
from .errors import InvalidArgument
from .owners import user_name
from .remote.urls import RemoteSpec
from .safepath import UnsafePathError, open_given, write_whole
from .segment import Segment

log = logging.getLogger(__name__)

PREFIX = ".kvcache-settings."
MAX_BYTES = 64 << 10
VERSION = 1


@dataclass(frozen=True)
class PoolSettings:
    """What a pool's processes follow beyond the pool: None is "none"."""

    remote: RemoteSpec | None = None
    access_log: LogSpec | None = None


NONE = PoolSettings()


def settings_path(pool_path: Path) -> Path:
    """The settings file of the pool file ``pool_path`` (``FOLDER/kvcache.NAME``)."""
    return pool_path.parent / (PREFIX + pool_path.name.removeprefix("kvcache."))


def read_settings(pool_path: Path, pool_name: str) -> PoolSettings:
    """The settings this process may follow; none if there are none, or if they are not its
    own user's or root's, or damaged (both logged)."""
    path = settings_path(pool_path)
    try:
        fd = open_given(path, what=f"settings of pool '{pool_name}'")
    except FileNotFoundError:
        return NONE
    except (OSError, UnsafePathError) as exc:
        log.warning("pool '%s': not following its settings (%s)", pool_name, exc)
        return NONE
    try:
        info = os.fstat(fd)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            log.warning("pool '%s': %s may be written by others: not following it", pool_name, path)
            return NONE
        with os.fdopen(os.dup(fd), "rb") as file:
            raw = file.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return _decode(raw)
    except (ValueError, TypeError, KeyError, InvalidArgument) as exc:
        log.warning(
            "pool '%s' has damaged settings %s (%s): not following them", pool_name, path, exc
        )
        return NONE


def write_settings(pool_path: Path, settings: PoolSettings, mode: int) -> None:
    """Write (or with none, remove) the settings of a pool this process's user owns.

    Written whole (:func:`~kvcache.safepath.write_whole`), so a reader sees the old or
    the new settings. ``mode`` is the pool's: group members may read the file
    when they may read the pool, nobody but the owner writes it.

    Raises:
        InvalidArgument: the settings file cannot be written (another user's pool).
    """
    path = settings_path(pool_path)
    if settings == NONE:
        remove_settings(pool_path)
        return
    data = json.dumps(_encode(settings)).encode()
    try:
        write_whole(path, data, mode & 0o640)
    except OSError as exc:
        raise InvalidArgument(
            f"cannot write the settings {path} ({exc.strerror or exc}): only the pool's "
            "owner may change its remote tier or access log"
        ) from None


def remove_settings(pool_path: Path) -> None:
    """Remove a pool's settings file, if it has one this user may remove."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        settings_path(pool_path).unlink()


def _encode(settings: PoolSettings) -> dict[str, Any]:
    remote = settings.remote
    logged = settings.access_log
    return {
        "version": VERSION,
        "remote": None
        if remote is None
        else {
            "url": remote.url,
            "namespace": remote.namespace,
            "write_through": remote.write_through,
            "timeout_s": remote.timeout_s,
            "password_file": remote.password_file,
            "key_file": remote.key_file,
        },
        "access_log": None
        if logged is None
        else {"path": os.fsdecode(logged.path), "max_bytes": logged.max_bytes},
    }


def _decode(raw: bytes) -> PoolSettings:
    if len(raw) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES} bytes")
    doc = json.loads(raw)
    if doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version')!r}, this kvcache reads {VERSION}")
    remote, logged = doc["remote"], doc["access_log"]
    spec = None
    if remote is not None:
        spec = RemoteSpec(
            str(remote["url"]),
            str(remote["namespace"]),
            write_through=bool(remote["write_through"]),
            timeout_s=float(remote["timeout_s"]),
            password_file=str(remote["password_file"]),
            key_file=str(remote["key_file"]),
        )
    log_spec = None
    if logged is not None:
        path, max_bytes = Path(str(logged["path"])), int(logged["max_bytes"])
        if not path.is_absolute() or max_bytes < MIN_MAX_BYTES:
            raise ValueError("a relative access log path or a cap below its minimum")
        log_spec = LogSpec(path, max_bytes)
    return PoolSettings(spec, log_spec)


class FollowedLog:
    """A pool's access log as this process follows it: switched in the settings file,
    reopened when the header's ``settings_serial`` says the settings changed.

    A collaborator of ``Pool`` (an observer of the prefix calls): it is given the pool's
    segment and two small callables over its header, and needs nothing else of the pool.

    Args:
        seg: the pool's segment (its path finds the settings file, its descriptor the owner).
        name: the pool's name, for messages.
        serial: reads the header's ``settings_serial`` word.
        bump_serial: adds one to it, under the pool's lock.
    """

    def __init__(
        self,
        seg: Segment,
        name: str,
        serial: Callable[[], int],
        bump_serial: Callable[[], None],
    ) -> None:
        self._segment = seg
        self._name = name
        self._serial = serial
        self._bump_serial = bump_serial
        self._log: AccessLog | None = None
        self._log_serial = -1  # none read yet: the first prefix call reads the settings

    def current(self) -> AccessLog | None:
        """The access log to write to now, or None (one header word read per call)."""
        serial = int(self._serial())
        if serial != self._log_serial:
            spec = read_settings(self._segment.path, self._name).access_log
            self.close()
            self._log, self._log_serial = (AccessLog(spec) if spec else None), serial
        return self._log

    def switch(
        self, path: str | os.PathLike[str] | None, max_size: str | int | None = None
    ) -> LogSpec | None:
        """``Pool.set_access_log``: write the new log (or none) into the settings file."""
        info = os.fstat(self._segment.fd)
        if info.st_uid != os.geteuid():
            raise InvalidArgument(
                f"only the pool's owner ({user_name(info.st_uid)}) may set pool "
                f"'{self._name}''s access log: its processes follow their owner's settings alone"
            )
        spec = None if path is None else log_spec(path, max_size)
        # The file is replaced whole (two switches at once: one wins whole), outside the pool
        # lock: its fsync must not stall every put and get; only the serial needs the lock.
        pool_path = self._segment.path
        settings = read_settings(pool_path, self._name)
        write_settings(pool_path, dataclasses.replace(settings, access_log=spec), info.st_mode)
        self._bump_serial()
        return spec

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
