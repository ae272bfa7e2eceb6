"""Whose files kvcache trusts: another user's pool or snapshot is refused unless named.

Whoever owns a pool's file can read every value in it, change any of them
(``chmod`` is the owner's) and hold its lock forever. A user who creates a
pool under the name a service will use, with ``--mode 666``, would read back
the KV that service stores (prompts can be recovered from it) or feed it
poisoned values; a snapshot made by another user is the same thing on disk.
Permission bits cannot stop that (the squatter granted the access on purpose,
and root passes every permission check), so ``open``, ``destroy`` and
``restore`` check the owner themselves, by ``fstat`` of the very descriptor
they go on to use. They accept a file owned by:

- the caller's effective uid;
- root, who can read and write the memory of every process anyway (the two
  owners OpenSSH's ``StrictModes`` accepts);
- a user the caller names (``trust_owner="alice"``, ``--trust-owner alice``):
  a colleague's group-shared pool (``--mode 660``);
- anyone, if the file's group is one of the caller's and the caller asks
  (``trust_group=True``, ``--trust-group``): any member of that group could
  have made it, and the caller vouches for them all.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgument, UntrustedOwnerError


@dataclass(frozen=True)
class Trust:
    """The owners whose files a caller accepts besides itself and root."""

    uids: frozenset[int] = frozenset()
    group: bool = False  # any owner, if the file's group is one of the caller's

    @classmethod
    def build(cls, owner: str | int | None = None, group: bool = False) -> Trust:
        """Trust ``owner`` (a user name or uid), and with ``group`` the caller's groups.

        Raises:
            InvalidArgument: no such user, or ``group`` is not a bool.
        """
        if not isinstance(group, bool):
            raise InvalidArgument(f"trust_group must be True or False, not {group!r}")
        return cls(frozenset() if owner is None else frozenset({uid_of(owner)}), group)

    def check(self, info: os.stat_result, what: str) -> None:
        """Raise unless the file ``info`` describes (``what``, for the message) is trusted.

        Raises:
            UntrustedOwnerError: owned by someone else, with how to trust them.
        """
        uid = info.st_uid
        if uid in (os.geteuid(), 0) or uid in self.uids:
            return
        mine = info.st_gid in _own_groups()
        if self.group and mine:
            return
        user = user_name(uid)
        also = " (or --trust-group: its group is one of yours)" if mine else ""
        raise UntrustedOwnerError(
            f"{what} belongs to user {user} (uid {uid}), who can read and change all of it: "
            f"if you trust {user}, pass --trust-owner {user}{also} "
            f"(Python: trust_owner={user!r}); otherwise use another name or file"
        )


TRUST_SELF = Trust()
"""The default: only the caller's own files (and root's)."""


def uid_of(user: str | int) -> int:
    """The uid of a user name, a uid, or a uid written as digits.

    Raises:
        InvalidArgument: no user of that name, or not a name nor a uid.
    """
    if isinstance(user, str) and user.isdigit():
        user = int(user)
    if isinstance(user, int) and not isinstance(user, bool) and user >= 0:
        return user
    if not isinstance(user, str):
        raise InvalidArgument(f"trust_owner must be a user name or uid, not {user!r}")
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise InvalidArgument(
            f"no user named {user!r} to trust: give a user name or uid (see getent passwd)"
        ) from None


def user_name(uid: int) -> str:
    """The name of ``uid``, or the number itself for a user without a name."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_name(path: Path) -> str | None:
    """The name of ``path``'s owner (for messages), or None if it cannot be told."""
    try:
        return user_name(path.stat().st_uid)
    except OSError:
        return None


def _own_groups() -> set[int]:
    return {os.getegid(), *os.getgroups()}
