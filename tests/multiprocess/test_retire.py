"""Destroying or replacing a pool that other, real processes have open.

Regression: ``destroy`` and ``restore --replace`` succeeded silently while
processes were attached, and those went on storing into the unlinked file,
where nobody could ever see their work. Both are now refused while other
processes have the pool open (the error names them); forced, they mark the old
file so that every attached process fails its next call with
``PoolDestroyedError`` (one that is mid-put fails it at publish) instead.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

import pytest
from workers import Children, wait_for_line

import kvcache
from kvcache import PoolBusyError


def _ask(child: subprocess.Popen, key: str, timeout: float = 30) -> dict:
    """Have a ``store-on-request`` child put ``key``; its report of how that went."""
    child.stdin.write(f"{key}\n".encode())
    child.stdin.flush()
    fd, line = child.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"child {child.pid} did not answer in {timeout}s: {line!r}"
        byte = os.read(fd, 1)
        assert byte, f"child {child.pid} exited: {child.stderr.read().decode()[-2000:]}"
        line += byte
    return json.loads(line)


def _attached_child(children: Children, name: str) -> subprocess.Popen:
    child = children.start("store-on-request", pool=name)
    wait_for_line(child, "ready", timeout=30)
    return child


def test_bug_destroy_while_attached_succeeded_silently(pool_name: str) -> None:
    kvcache.create(pool_name, "1M").close()
    with Children() as children:
        child = _attached_child(children, pool_name)
        with pytest.raises(PoolBusyError, match=rf"1 other process\(es\) \({child.pid}\).*--force"):
            kvcache.destroy(pool_name)
        assert pool_name in kvcache.list_pools()
        assert _ask(child, "before")["error"] is None  # refused: nothing changed for it
        kvcache.destroy(pool_name, force=True)
        assert pool_name not in kvcache.list_pools()
        told = _ask(child, "after")
        assert told["error"] == "PoolDestroyedError", told
        assert f"pool '{pool_name}' was destroyed" in told["message"]
        children.result(child)  # its stdin ends: it exits


def test_bug_restore_replace_while_attached_lost_their_work(pool_name: str, tmp_path) -> None:
    with kvcache.create(pool_name, "1M") as pool:
        pool.put("in-snapshot", b"1")
        snapshot = kvcache.persist(pool, tmp_path / "s.kvsnap")
        pool.put("after-persist", b"2")
    with Children() as children:
        child = _attached_child(children, pool_name)
        with pytest.raises(PoolBusyError, match=rf"\({child.pid}\).*to replace it anyway"):
            kvcache.restore(pool_name, snapshot, replace=True)
        with kvcache.open(pool_name) as pool:
            assert sorted(pool.keys()) == ["after-persist", "in-snapshot"]  # untouched
        kvcache.restore(pool_name, snapshot, replace=True, force=True).close()
        told = _ask(child, "late-work")
        assert told["error"] == "PoolDestroyedError", told
        assert "replaced by a restore" in told["message"]
        children.result(child)  # its stdin ends: it exits
    with kvcache.open(pool_name) as pool:
        assert pool.keys() == ["in-snapshot"]


def test_a_put_in_flight_when_the_pool_is_destroyed_fails_at_publish(pool_name: str) -> None:
    """The copy of a large value runs outside the lock; it must not publish into the
    destroyed file as if it had been stored."""
    kvcache.create(pool_name, "4M").close()
    with Children() as children:
        writer = children.start("pause-mid-write", pool=pool_name, key="big", size=600_000, seed=3)
        wait_for_line(writer, "copying", timeout=30)
        kvcache.destroy(pool_name, force=True)
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        result = children.result(writer)
    assert result["error"] == "PoolDestroyedError", result


def test_open_racing_a_replace_opens_the_new_pool(pool_name: str, tmp_path, monkeypatch) -> None:
    """A restore --replace that lands between open's opening of the file and its
    first lock: the open used to return the old, replaced pool. The interleaving is
    forced by running the (real) restore right after the first attach."""
    with kvcache.create(pool_name, "1M") as pool:
        pool.put("restored", b"1")
        snapshot = kvcache.persist(pool, tmp_path / "s.kvsnap")
        pool.delete("restored")
        pool.put("replaced", b"2")
    attach = kvcache.segment.attach
    raced: list[str] = []

    def attach_then_replace(name: str, *args: object) -> kvcache.segment.Segment:
        seg = attach(name, *args)
        if not raced:
            raced.append(name)
            kvcache.restore(name, snapshot, replace=True).close()
        return seg

    monkeypatch.setattr(kvcache.segment, "attach", attach_then_replace)
    with kvcache.open(pool_name) as pool:
        assert raced == [pool_name]
        assert pool.keys() == ["restored"]
        assert pool._segment.has_its_name()
