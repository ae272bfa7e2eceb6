"""A pool's access log: what its prefix caches were asked, for ``kvcache simulate``.

Opt-in (``create(access_log=FILE)``, ``Pool.set_access_log``). The file's path
and size cap live in the pool's settings (``kvcache.settings``: its owner's file,
never the pool's header, which group members may write), so every process of
the owner that uses the pool writes to the same log, and a switch made by one
is seen by the others at their next prefix call. The file is opened as
:mod:`kvcache.safepath` opens files: never through a folder or symlink another
user controls, never another user's file, never a FIFO.

``PrefixCache`` writes one JSON line per ``retrieve`` (a request: the chain of
chunk ids it asked for and how many were found) and per ``store`` (the chunks
written and the chunk before them)::

    {"timestamp": 1764858000123.4, "op": "retrieve", "hash_ids": [...], "hit": 31,
     "input_length": 2048, "block_tokens": 64, "block_bytes": 1048576}
    {"timestamp": 1764858000187.9, "op": "store", "parent": 81254..., "hash_ids": [...],
     "block_tokens": 64, "block_bytes": 1048576}

A retrieve line is a request in the Mooncake trace format, so ``simulate``
replays a log as it is (it skips the store lines). A chunk id is the first 60
bits of the chunk's chained key, so it names the whole prefix up to the
chunk's end, as Mooncake's ``hash_ids`` do; no token ids or tenant names
are written. Pool-level ``get``/``put`` are not logged: without a prefix's
structure (which chunk follows which) a replay could not tell what was reusable.

Bounded: once the file passes half the cap it is renamed to ``FILE.1``
(replacing the previous one) and a new file begun, so the two hold at most
about the cap. Each line goes out in one ``write`` to a file opened with
``O_APPEND``, so lines of concurrent processes never interleave; the rename
happens under an ``flock`` of the file, and a process whose file was renamed
by another opens the new one before its next line. A log that cannot be
written (disk full, folder removed) logs one warning and is skipped: an access
log never fails the cache call it records.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidArgument
from .safepath import UnsafePathError, open_given
from .units import format_size, parse_size

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 << 20
MIN_MAX_BYTES = 64 << 10
MAX_PATH_BYTES = 255  # the header field
ID_HEX_DIGITS = 15
"""A chunk id is this many hex digits of its key's chained digest: 60 bits, so every
id is a positive int64 (numpy and the trace reader keep them exactly)."""


@dataclass(frozen=True)
class LogSpec:
    """Where a pool's access log goes and how large it may grow (with its one rotated file)."""

    path: Path
    max_bytes: int = DEFAULT_MAX_BYTES


def log_spec(path: str | os.PathLike[str], max_size: str | int | None = None) -> LogSpec:
    """A checked ``LogSpec``: an absolute path in an existing folder, where a file can be
    opened for appending now (so a typo is an error here, not a silent empty log).

    Raises:
        InvalidArgument: a bad size, or a path that cannot be written.
    """
    max_bytes = DEFAULT_MAX_BYTES if max_size is None else parse_size(max_size, what="log size")
    if max_bytes < MIN_MAX_BYTES:
        raise InvalidArgument(
            f"access log size {format_size(max_bytes)} is too small: give at least "
            f"{format_size(MIN_MAX_BYTES)}"
        )
    absolute = Path(os.path.abspath(os.fspath(path)))
    if len(os.fsencode(absolute)) > MAX_PATH_BYTES:
        raise InvalidArgument(
            f"access log path {absolute} is over {MAX_PATH_BYTES} bytes: choose a shorter one"
        )
    try:
        os.close(_open_for_append(absolute))
    except UnsafePathError as exc:
        raise InvalidArgument(f"cannot write the access log: {exc}") from None
    except OSError as exc:
        raise InvalidArgument(
            f"cannot write the access log {absolute}: {exc.strerror or exc}; "
            "give a file in a folder you can write"
        ) from None
    return LogSpec(absolute, max_bytes)


def chunk_id(key: str) -> int:
    """The id a chunk key is logged as (see the module docstring)."""
    return int(key[-64 : -64 + ID_HEX_DIGITS], 16)


def chunk_ids(keys: Sequence[str]) -> list[int]:
    return [chunk_id(key) for key in keys]


class AccessLog:
    """Appends JSON lines to ``spec.path``, rotating it as the module docstring says."""

    def __init__(self, spec: LogSpec) -> None:
        self.spec = spec
        self._fd = -1
        self._inode = -1
        self._broken = False

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (plus a timestamp in milliseconds) as one line."""
        data = json.dumps({"timestamp": round(time.time() * 1000, 1), **record}).encode() + b"\n"
        try:
            fd = self._current()
            os.write(fd, data)
            if os.fstat(fd).st_size >= self.spec.max_bytes // 2:
                self._rotate(fd)
        except (OSError, UnsafePathError) as exc:
            if not self._broken:
                log.warning("access log %s not written (%s): skipping it", self.spec.path, exc)
            self._broken = True
            return
        self._broken = False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _current(self) -> int:
        """Our descriptor of the file now at the path (another process may have rotated it)."""
        try:
            inode = os.stat(self.spec.path).st_ino
        except FileNotFoundError:
            inode = -1
        if inode != self._inode or self._fd < 0:
            self.close()
            self._fd = _open_for_append(self.spec.path)
            self._inode = os.fstat(self._fd).st_ino
        return self._fd

    def _rotate(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            here = os.stat(self.spec.path)
            # still the file we wrote, and still too big: no other process rotated it meanwhile
            if here.st_ino == self._inode and here.st_size >= self.spec.max_bytes // 2:
                os.replace(self.spec.path, f"{self.spec.path}.1")
        except FileNotFoundError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _open_for_append(path: Path) -> int:
    """Never through a folder or symlink another user controls, never their file, never a
    FIFO (which would block the prefix call): see :mod:`kvcache.safepath`."""
    return open_given(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600, what="access log")
