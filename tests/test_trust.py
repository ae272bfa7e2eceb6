"""What another user may do to a shared pool: store and read, never steer our process.

A real second user (``nobody``, in the pool's group) plants what an attacker on the
machine would: settings files naming a log or a remote, symlinks in shared folders,
FIFOs, files of theirs. Our process (root) must not append to, rename, dial or read
anything they chose, and must not block on what they planted."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument, KVLayout, PrefixCache
from kvcache.safepath import UnsafePathError, open_given
from kvcache.segment import segment_path
from kvcache.settings import settings_path
from other_user import NOBODY, needs_root, run_as_nobody

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float16")
CHUNK = 4
HANG_GUARD_S = 10.0  # not a timing assertion: a call that took this long would have hung


def kv_for(num_tokens: int) -> np.ndarray:
    return np.ones((2, 2, 1, num_tokens, 4), np.float16)


def serve_one(pool: kvcache.Pool) -> None:
    """A request's prefix calls: each reads the pool's settings (its access log)."""
    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    tokens = list(range(100, 117))
    pc.retrieve(tokens)
    pc.store(tokens, kv_for(len(tokens)))


@pytest.fixture
def group_pool(pool_name) -> Iterator[kvcache.Pool]:
    """Root's pool shared with the group ``nobody`` is in (mode 0660, as the README shares)."""
    pool = kvcache.create(pool_name, "4M", page_size="4K", mode=0o660)
    os.chown(segment_path(pool_name), 0, NOBODY)
    yield pool
    pool.close()
    settings_path(segment_path(pool_name)).unlink(missing_ok=True)


def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "root-only"
    path.write_text("root's secret\n")
    path.chmod(0o600)
    return path


def plant_settings(pool_name: str, doc: dict) -> None:
    """As ``nobody``: write a settings file beside root's pool (in sticky /dev/shm)."""
    path = settings_path(segment_path(pool_name))

    def write() -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, json.dumps(doc).encode())
        os.close(fd)
        return 0

    code, _, stderr = run_as_nobody(write)
    assert code == 0, stderr


@needs_root
def test_bug_a_group_member_redirected_the_access_log(group_pool, pool_name, tmp_path):
    target = secret_file(tmp_path)
    before = target.read_bytes()
    doc = {"version": 1, "remote": None, "access_log": {"path": str(target), "max_bytes": 65536}}
    plant_settings(pool_name, doc)

    def switch() -> int:  # and through the API, as a group member would try first
        with kvcache.open(pool_name) as theirs:
            try:
                theirs.set_access_log("/tmp/theirs.log")
            except InvalidArgument as refused:
                print(refused)
                return 0
        return 1

    code, out, stderr = run_as_nobody(switch, NOBODY)
    assert code == 0, stderr
    assert "only the pool's owner" in out
    serve_one(group_pool)
    assert group_pool.access_log is None
    assert target.read_bytes() == before and not Path(f"{target}.1").exists()
    # the control: the same settings written by root are followed (the test can fail)
    settings_path(segment_path(pool_name)).unlink()
    log = tmp_path / "own.log"
    group_pool.set_access_log(log)
    serve_one(group_pool)
    assert '"op": "retrieve"' in log.read_text()


@needs_root
def test_bug_a_group_member_pointed_the_remote_at_their_server_and_got_a_password(
    group_pool, pool_name, tmp_path
):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    remote = {
        "url": f"redis://127.0.0.1:{port}/0",
        "namespace": "stolen",
        "write_through": True,
        "timeout_s": 0.2,
        "password_file": str(secret_file(tmp_path)),
        "key_file": "",
    }
    plant_settings(pool_name, {"version": 1, "remote": remote, "access_log": None})
    with kvcache.open(pool_name) as mine:
        assert mine.remote is None
        mine.put("k", b"root's KV")
        assert mine.get("other") is None
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody dialled their server
    # the control: root's own settings with that remote are followed (the test can fail)
    settings_path(segment_path(pool_name)).unlink()
    path = settings_path(segment_path(pool_name))
    path.write_text(json.dumps({"version": 1, "remote": remote, "access_log": None}))
    path.chmod(0o600)
    with kvcache.open(pool_name) as mine:
        assert mine.remote is not None
        mine.get("other")
    conn, _ = listener.accept()
    conn.close()
    listener.close()


@needs_root
def test_group_members_settings_and_a_writable_one_of_ours_are_both_ignored(
    group_pool, pool_name, tmp_path
):
    path = settings_path(segment_path(pool_name))
    log = tmp_path / "a.log"
    path.write_text(
        json.dumps(
            {"version": 1, "remote": None, "access_log": {"path": str(log), "max_bytes": 1 << 20}}
        )
    )
    path.chmod(0o666)  # ours, but anyone may change it: as good as theirs
    serve_one(group_pool)
    assert not log.exists()
    path.chmod(0o600)
    group_pool._engine.views.header_q[kvcache.layout.H.settings_serial] += 1  # what a switch does
    serve_one(group_pool)
    assert log.exists()


def test_bug_a_fifo_at_the_access_log_path_blocked_prefix_calls_forever(
    make_pool, tmp_path, caplog
):
    log = tmp_path / "access.log"
    pool = make_pool("4M", page_size="4K", access_log=log)
    log.unlink()
    os.mkfifo(log)  # no reader: an open for writing without O_NONBLOCK waits forever
    done = threading.Event()
    worker = threading.Thread(target=lambda: (serve_one(pool), done.set()), daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert done.is_set(), "a prefix call blocked on a FIFO at the access log's path"
    assert "not a regular file" in caplog.text
    with pytest.raises(InvalidArgument, match="not a regular file"):
        pool.set_access_log(log)


@needs_root
def test_a_symlink_planted_in_a_folder_others_can_write_is_never_followed(
    make_pool, shared_dir, tmp_path, caplog
):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "a.log").write_text("root's own file\n")

    def plant() -> int:
        os.symlink(private, shared_dir / "logs")
        return 0

    assert run_as_nobody(plant)[0] == 0
    with pytest.raises(InvalidArgument, match="something another user made"):
        make_pool("4M", access_log=shared_dir / "logs" / "a.log")
    assert (private / "a.log").read_text() == "root's own file\n"


@needs_root
def test_a_file_another_user_owns_is_never_appended_to(make_pool, shared_dir):
    sticky = Path(tempfile.mkdtemp(prefix="kvcache-sticky-"))
    sticky.chmod(0o1777)  # as /tmp: anyone creates, only owners move
    try:

        def plant() -> int:
            (sticky / "a.log").write_text("theirs\n")
            return 0

        assert run_as_nobody(plant)[0] == 0
        with pytest.raises(InvalidArgument, match="another user"):
            make_pool("4M", access_log=sticky / "a.log")
        assert (sticky / "a.log").read_text() == "theirs\n"
    finally:
        shutil.rmtree(sticky)


def test_safe_open_refuses_what_it_says_and_opens_the_rest(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "file").write_text("x")
    os.mkfifo(own / "fifo")
    os.symlink(own / "file", own / "link")
    os.symlink(own, tmp_path / "folder-link")  # in a folder only we may write: followed
    os.close(open_given(own / "file"))
    os.close(open_given(tmp_path / "folder-link" / "file"))
    os.close(open_given(own / "new", os.O_WRONLY | os.O_CREAT))
    for path, why in [(own / "fifo", "not a regular file"), (own / "link", "symbolic link")]:
        with pytest.raises(UnsafePathError, match=why):
            open_given(path)
    own.chmod(0o777)  # now anyone may swap what lies in it
    with pytest.raises(UnsafePathError, match="other users can change"):
        open_given(own / "file")
    own.chmod(0o1777)  # sticky: what we made there is still ours alone
    os.close(open_given(own / "file"))
    assert stat.S_ISDIR(os.stat(own).st_mode)


@needs_root
def test_a_persist_never_writes_through_a_folder_another_user_controls(
    make_pool, shared_dir, tmp_path
):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)

    def plant() -> int:
        os.symlink(private, shared_dir / "snaps")
        return 0

    assert run_as_nobody(plant)[0] == 0
    pool = make_pool("1M")
    pool.put("k", b"v")
    for folder in (shared_dir / "snaps", shared_dir):
        with pytest.raises(kvcache.SnapshotError, match="pick another --path"):
            kvcache.persist(pool, folder / "p.kvsnap")
    assert list(private.iterdir()) == [] and not (shared_dir / "p.kvsnap").exists()
    kvcache.persist(pool, private / "p.kvsnap")  # the control: a folder of our own
    assert (private / "p.kvsnap").exists()


@needs_root
def test_a_trace_is_never_read_through_a_symlink_another_user_planted(shared_dir, tmp_path):
    from kvcache.simulate import TraceError, read_trace

    mine = tmp_path / "trace.jsonl"
    mine.write_text('{"hash_ids": [1, 2, 3]}\n')

    def plant() -> int:
        os.symlink(mine, shared_dir / "trace.jsonl")
        return 0

    assert run_as_nobody(plant)[0] == 0
    with pytest.raises(TraceError, match="another user"):
        read_trace(shared_dir / "trace.jsonl")
    assert read_trace(mine).num_requests == 1  # the control: the same file by its own path
