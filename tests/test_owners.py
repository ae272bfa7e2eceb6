"""Pools, snapshots and build files of other users are refused unless trusted.

Regression: another user could create a pool (``--mode 666``) under the name a
service would use; the service (root or not) opened it, stored its KV there,
and the other user read it back; a snapshot of theirs restored as the
caller's own. The other users here are real: forked children that drop to
``nobody`` (``other_user``); the test process is root, which the kernel lets
open anything, so it is kvcache's own check that must refuse.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcache
from kvcache import InvalidArgument, UntrustedOwnerError, builds
from kvcache.segment import segment_path
from other_user import NOBODY, needs_root, run_as_nobody

pytestmark = needs_root


@pytest.fixture
def foreign(shared_dir: Path) -> Iterator[tuple[str, Path]]:
    """A pool made by ``nobody`` with mode 666 (one entry), and its snapshot."""
    name, snapshot = f"test-{uuid.uuid4().hex[:12]}", shared_dir / "theirs.kvsnap"
    _as_nobody_make(name, snapshot)
    yield name, snapshot
    segment_path(name).unlink(missing_ok=True)


def _as_nobody_make(name: str, snapshot: Path | None, gid: int = NOBODY) -> None:
    def make() -> int:
        with kvcache.create(name, "1M", mode=0o666, force=True) as pool:
            pool.put("planted", b"the squatter's value")
            if snapshot is not None:
                kvcache.persist(pool, snapshot)
        return 0

    code, _, stderr = run_as_nobody(make, gid)
    assert code == 0, stderr


def test_bug_open_accepted_another_users_pool(foreign) -> None:
    name, _ = foreign
    with pytest.raises(UntrustedOwnerError) as refused:
        kvcache.open(name)
    message = str(refused.value)
    assert f"pool '{name}' belongs to user nobody (uid {NOBODY})" in message
    assert "--trust-owner nobody" in message and "trust_owner='nobody'" in message
    assert "\n" not in message
    for trusted in ("nobody", NOBODY, str(NOBODY)):
        with kvcache.open(name, trust_owner=trusted) as pool:
            assert pool.get("planted") == b"the squatter's value"


def test_bug_restore_accepted_another_users_snapshot(foreign, pool_name) -> None:
    _, snapshot = foreign
    with pytest.raises(UntrustedOwnerError, match=rf"snapshot {snapshot} belongs to user nobody"):
        kvcache.restore(pool_name, snapshot)
    assert pool_name not in kvcache.list_pools()
    assert kvcache.inspect_snapshot(snapshot).num_entries == 1  # reading it restores nothing
    with kvcache.restore(pool_name, snapshot, mode=0o600, trust_owner="nobody") as pool:
        assert pool.get("planted") == b"the squatter's value"
    assert segment_path(pool_name).stat().st_uid == 0  # the restored pool is the caller's


def test_destroying_another_users_pool_needs_the_trust_too(foreign) -> None:
    name, _ = foreign
    with pytest.raises(UntrustedOwnerError, match="--trust-owner nobody"):
        kvcache.destroy(name)
    assert name in kvcache.list_pools()
    kvcache.destroy(name, trust_owner="nobody")
    assert name not in kvcache.list_pools()


def test_trust_group_accepts_a_pool_whose_group_is_one_of_yours(pool_name) -> None:
    """``nobody`` with group root (0, the caller's) makes the pool."""
    _as_nobody_make(pool_name, None, gid=0)
    with pytest.raises(UntrustedOwnerError, match="or --trust-group: its group is one of yours"):
        kvcache.open(pool_name)
    with kvcache.open(pool_name, trust_group=True) as pool:
        assert pool.get("planted") is not None
    kvcache.destroy(pool_name, trust_group=True)


def test_trust_group_does_not_cover_a_group_that_is_not_yours(foreign) -> None:
    name, _ = foreign  # group nogroup: root is not a member
    with pytest.raises(UntrustedOwnerError) as refused:
        kvcache.open(name, trust_group=True)
    assert "--trust-group" not in str(refused.value)


def test_root_owned_pools_are_trusted_by_everyone(pool_name) -> None:
    """Root can read any process's memory anyway: refusing its pools protects nothing."""
    with kvcache.create(pool_name, "1M", mode=0o666, force=True) as pool:
        pool.put("k", b"from root")

    def read() -> int:
        with kvcache.open(pool_name) as theirs:
            return 0 if theirs.get("k") == b"from root" else 1

    assert run_as_nobody(read)[0] == 0


def test_an_unknown_user_to_trust_is_a_clear_error(foreign) -> None:
    name, _ = foreign
    with pytest.raises(InvalidArgument, match="no user named 'no-such-user'"):
        kvcache.open(name, trust_owner="no-such-user")
    for bad in (-1, True, 1.5):
        with pytest.raises(InvalidArgument, match="user name or uid"):
            kvcache.open(name, trust_owner=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [0o400, 0o000, 0o040])
def test_a_non_root_user_cannot_create_a_pool_its_owner_cannot_use(pool_name, mode) -> None:
    """Issue 15 item 10: such a pool used to be created, then refused by open and destroy."""

    def create() -> int:
        try:
            kvcache.create(pool_name, "1M", mode=mode)
        except InvalidArgument as exc:
            print(exc)
            return 0
        return 1

    code, stdout, stderr = run_as_nobody(create)
    assert code == 0, stderr
    assert "does not let the owner read and write" in stdout
    assert pool_name not in kvcache.list_pools()
    assert [f for f in os.listdir(segment_path(pool_name).parent) if pool_name in f] == []


def test_other_users_abandoned_build_files_are_left_alone(pool_name) -> None:
    """Even root leaves them: their owner's next create removes them."""
    hidden = segment_path(pool_name).parent / f".kvcache.{pool_name}.{'0' * 12}"

    def leave_one() -> int:
        hidden.write_bytes(b"half-built")
        os.utime(hidden, (0, 0))  # long abandoned, and nobody leases it
        return 0

    assert run_as_nobody(leave_one)[0] == 0
    try:
        assert builds.remove_abandoned([hidden], min_age_s=0) == []
        assert hidden.exists()

        def clean() -> int:
            return 0 if builds.remove_abandoned([hidden], min_age_s=0) == [hidden] else 1

        assert run_as_nobody(clean)[0] == 0  # its owner does remove it
        assert not hidden.exists()
    finally:
        hidden.unlink(missing_ok=True)
