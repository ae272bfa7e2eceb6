"""Open files at paths a user gave, so that no other user can steer where the open lands.

kvcache opens files at paths it is given: an access log it appends to, a
remote's password and key files, a pool's settings file. On a shared machine
another user may have planted something on the way: a symlink in a folder
they can write (``/tmp/logs -> /root``), a FIFO that blocks ``open`` forever,
a file of theirs that we would then append to. :func:`open_given` refuses all
three before anything is written:

- every folder on the way is opened relative to the one before (``openat``
  with ``O_NOFOLLOW``) and must be owned by the caller or root and writable by
  no one else, unless it is sticky (``/tmp``), where only its owner may move
  what another user made; an entry in a sticky folder must be the caller's or
  root's, since anyone may have created it;
- a symlink on the way is followed only where it lies in such a folder (a
  trusted user made it: ``/var/run -> /run``); anywhere else it is refused;
- the file itself is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO or device
  is refused at once by its ``fstat``, never waited on) and must be a regular
  file; one opened to write must be the caller's own, one opened to read the
  caller's or root's unless ``any_owner`` (a snapshot from elsewhere is data,
  validated as it is read).

We chose a walk over a check of the final path alone (``realpath`` then
``stat``) because a check and a later open are two lookups that a planted
symlink swap can come between; here each step holds the folder it checked.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable
from pathlib import Path, PurePath

from .errors import InvalidArgument

MAX_SYMLINKS = 40  # as the kernel's own path walk allows
_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TRUSTED_UIDS = frozenset({0})


class UnsafePathError(InvalidArgument):
    """A path another user could steer, or that is not a regular file."""


def open_given(
    path: str | os.PathLike[str],
    flags: int = os.O_RDONLY,
    mode: int = 0o600,
    *,
    any_owner: bool = False,
    what: str = "file",
) -> int:
    """Open ``path`` as :mod:`kvcache.safepath` describes; the caller closes the descriptor.

    Args:
        path: an absolute or relative path (relative to the current folder).
        flags: ``os.open`` flags (``O_CREAT`` and ``O_APPEND`` as usual).
        mode: permission bits of a file ``O_CREAT`` makes.
        any_owner: a file opened to read may belong to anyone.
        what: what the file is, for messages ("access log").

    Raises:
        UnsafePathError: a folder or symlink another user could have changed,
            a file that is not regular, or one owned by another user.
        OSError: the open itself failed (no such file, permission denied, ...).
    """
    absolute = os.path.abspath(os.fspath(path))
    folder, name = _open_parent(absolute, what)
    try:
        try:
            fd = os.open(
                name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=folder
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(
                    f"{what} {absolute} is a symbolic link: give the real file's path"
                ) from None
            if exc.errno == errno.ENXIO:  # a FIFO with no reader, or a device without one
                raise _not_regular(what, absolute) from None
            raise
    finally:
        os.close(folder)
    try:
        _check_file(os.fstat(fd), absolute, flags, any_owner, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_whole(
    path: Path,
    data: bytes,
    mode: int = 0o600,
    place: Callable[[Path, Path], None] = os.replace,
) -> None:
    """Write ``data`` as the file ``path``, whole: a reader sees the old file or the new one.

    The data goes to a temporary file beside ``path`` (a random name, opened
    with ``O_EXCL | O_NOFOLLOW``, so nothing planted there is written through),
    is synced, and is then placed by ``place``: ``os.replace``, or ``os.link``
    to fail with ``FileExistsError`` where ``path`` exists.

    Raises:
        OSError: the folder cannot be written, or ``place`` failed.
    """
    temp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        place(temp, path)
    finally:
        temp.unlink(missing_ok=True)  # after a link the file keeps the data; a rename moved it


def check_folder(path: str | os.PathLike[str], what: str = "folder") -> None:
    """Refuse a folder that another user could change (see the module docstring).

    Raises:
        UnsafePathError, OSError: as :func:`open_given`.
    """
    # a last part the walk does not open, so that it checks every folder of ``path``
    folder, _ = _open_parent(os.path.join(os.path.abspath(os.fspath(path)), "x"), what)
    os.close(folder)


def _open_parent(absolute: str, what: str) -> tuple[int, str]:
    """A descriptor of the folder that holds ``absolute``'s last part, and that part."""
    parts = deque(PurePath(absolute).parts[1:])
    if not parts:
        raise UnsafePathError(f"{what} path {absolute} names no file")
    fd, info = _open_root()
    links = 0
    try:
        while len(parts) > 1:
            name = parts.popleft()
            if name in ("", "."):
                continue
            try:
                child = os.open(name, _FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(link.st_mode):
                    raise
                _check_entry(info, link, absolute, what)
                links += 1
                if links > MAX_SYMLINKS:
                    raise UnsafePathError(
                        f"{what} path {absolute} has too many symbolic links"
                    ) from None
                target = PurePath(os.readlink(name, dir_fd=fd))
                parts.extendleft(
                    reversed(target.parts[1:] if target.is_absolute() else target.parts)
                )
                if target.is_absolute():
                    os.close(fd)
                    fd, info = _open_root()
                continue
            child_info = os.fstat(child)
            if name != "..":
                _check_entry(info, child_info, absolute, what)
            os.close(fd)
            fd, info = child, child_info
            _check_folder_info(info, absolute, what)
        return fd, parts[0]
    except BaseException:
        os.close(fd)
        raise


def _open_root() -> tuple[int, os.stat_result]:
    fd = os.open("/", _FOLDER)
    return fd, os.fstat(fd)


def _trusted(uid: int) -> bool:
    return uid == os.geteuid() or uid in _TRUSTED_UIDS


def _check_folder_info(info: os.stat_result, absolute: str, what: str) -> None:
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not _trusted(info.st_uid) or (writable_by_others and not info.st_mode & stat.S_ISVTX):
        raise UnsafePathError(
            f"{what} {absolute} lies in a folder that other users can change: "
            "give a path in a folder only you (or root) can write"
        )


def _check_entry(folder: os.stat_result, entry: os.stat_result, absolute: str, what: str) -> None:
    """An entry of a sticky, shared folder may have been made by anyone: it must be ours."""
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if shared and not _trusted(entry.st_uid):
        raise UnsafePathError(
            f"{what} {absolute} passes through something another user made in a "
            "shared folder: give a path of your own"
        )


def _check_file(
    info: os.stat_result, absolute: str, flags: int, any_owner: bool, what: str
) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(what, absolute)
    writing = flags & (os.O_WRONLY | os.O_RDWR)
    if writing and info.st_uid != os.geteuid():
        raise UnsafePathError(
            f"{what} {absolute} belongs to another user: kvcache writes only to your own files"
        )
    if not writing and not any_owner and not _trusted(info.st_uid):
        raise UnsafePathError(
            f"{what} {absolute} belongs to another user, who could change it: "
            "use a file of your own"
        )


def _not_regular(what: str, absolute: str) -> UnsafePathError:
    return UnsafePathError(f"{what} {absolute} is not a regular file: give a file's path")
