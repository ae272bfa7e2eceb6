"""Moving slot states between the pool and the server's slots, through the slot folder.

llama-server saves and restores a slot only as a file in its ``--slot-save-path``
folder, by a bare file name. The proxy writes a stored state there and asks for
a restore, or asks for a save and reads the file back; either way the file is
removed at once. File names are the proxy's own (``kvcache-slot<N>.bin``):
nothing read from the pool ever becomes a path, a name or a URL, because the
pool's bytes may be written by any member of its group.

The folder must be private to the proxy's user (mode 0700, checked by
:func:`check_private`): whoever can write into it can hand the server a state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InvalidArgument
from ...prefix.states import shared_prefix
from ...safepath import UnsafePathError, check_folder
from .slotfile import read_tokens
from .store import Problems, StateStore
from .upstream import Upstream, UpstreamError


def check_private(folder: Path) -> Path:
    """``folder``, made absolute, if it is a directory only its owner -- this user -- can use.

    Raises:
        InvalidArgument: it is missing, not a directory, another user's, or open to others,
            or a folder above it is one another user may change (see :mod:`kvcache.safepath`).
    """
    try:
        info = os.stat(folder)
        if stat.S_ISDIR(info.st_mode):  # and every folder above it, or another user may swap it
            check_folder(folder, "slot folder")
    except UnsafePathError:
        raise
    except OSError as exc:
        raise InvalidArgument(f"slot folder {folder}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidArgument(f"slot folder {folder} is not a directory")
    if info.st_uid != os.geteuid():
        raise InvalidArgument(f"slot folder {folder} belongs to another user: use one of yours")
    if info.st_mode & 0o077:
        raise InvalidArgument(
            f"slot folder {folder} is open to other users (mode {info.st_mode & 0o777:o}): "
            f"chmod 700 {folder}"
        )
    return folder.absolute()


@dataclass(frozen=True)
class Restored:
    """A state put into a slot: the tokens the slot now holds, and how many the request shares."""

    tokens: np.ndarray
    num_shared: int


class SlotExchange:
    """Restores stored states into slots and saves slots into the pool, never raising.

    Args:
        store: the pool side.
        upstream: the server.
        slot_dir: the server's ``--slot-save-path`` (private, see :func:`check_private`).
        problems: where failures are counted.
    """

    def __init__(
        self, store: StateStore, upstream: Upstream, slot_dir: Path, problems: Problems
    ) -> None:
        self.store = store
        self.upstream = upstream
        self.slot_dir = slot_dir
        self.problems = problems

    async def restore(self, slot: int, tokens: np.ndarray, held: np.ndarray) -> Restored | None:
        """Put the stored state sharing the longest prefix with ``tokens`` into ``slot``.

        Only a state that shares more tokens with the request than ``held`` (what
        the slot holds already) is restored. Returns None when nothing was tried;
        a refused restore also erases the slot, which the server may have
        half-loaded, and returns it empty.
        """
        hit = await asyncio.to_thread(self.store.get, tokens)
        if hit is None or hit.num_shared <= shared_prefix(held, tokens):
            return None
        file_tokens = read_tokens(hit.payload)
        if file_tokens is None or not np.array_equal(file_tokens, hit.tokens):
            self.problems.note("damaged_state", "a slot file's tokens differ from its record's")
            return None
        name = _file_name(slot)
        try:
            await asyncio.to_thread(_write_private, self.slot_dir / name, hit.payload)
            await self.upstream.slot_action(slot, "restore", name)
        except (UpstreamError, OSError) as exc:
            self.problems.note("restore_refused", exc)
            await self._erase(slot)
            return Restored(np.zeros(0, np.int64), 0)
        finally:
            _remove(self.slot_dir / name)
        return Restored(hit.tokens.copy(), hit.num_shared)  # not a view holding the whole value

    async def save(self, slot: int) -> np.ndarray | None:
        """Store what ``slot`` holds in the pool; the tokens it holds, or None if unknown."""
        name = _file_name(slot)
        path = self.slot_dir / name
        try:
            doc = await self.upstream.slot_action(slot, "save", name)
            data = await asyncio.to_thread(path.read_bytes)
            tokens = read_tokens(data)
            if tokens is None or doc.get("n_written") != len(data):
                raise UpstreamError(f"the saved slot file is not whole ({len(data)} bytes)")
        except (UpstreamError, OSError) as exc:
            self.problems.note("save_failed", exc)
            return None
        finally:
            _remove(path)
        if len(tokens):
            await asyncio.to_thread(self.store.put, tokens, data)
        return tokens

    async def _erase(self, slot: int) -> None:
        try:
            await self.upstream.slot_action(slot, "erase", None)
        except UpstreamError as exc:
            self.problems.note("restore_refused", f"erasing slot {slot} afterwards: {exc}")


def _file_name(slot: int) -> str:
    return f"kvcache-slot{slot}.bin"


def _write_private(path: Path, data: memoryview) -> None:
    """Write ``data`` to a new file only this user can read; never through a symbolic link."""
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
