"""segment: names, exclusive create, attach, reservation, permissions, real /dev/shm files."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import (
    IncompatiblePoolError,
    InvalidArgument,
    OutOfSharedMemoryError,
    PoolExistsError,
    PoolNotFoundError,
)
from kvcache import segment as seg
from kvcache.layout import FORMAT_VERSION, HEADER_DTYPE, Geometry

G = 1 << 30


def _traces(name: str) -> list[str]:
    """Every file in the shared-memory folder that carries ``name`` (final or hidden)."""
    return [f for f in os.listdir(seg.shm_dir()) if name in f]


def _path(name: str) -> Path:
    return seg.segment_path(name)


@pytest.fixture
def umask() -> Iterator[Callable[[int], int]]:
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def test_segments_live_in_dev_shm(pool_name: str) -> None:
    assert "KVCACHE_SHM_DIR" not in os.environ
    assert seg.shm_dir() == Path("/dev/shm")
    assert _path(pool_name) == Path("/dev/shm") / f"kvcache.{pool_name}"


# ------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    "name",
    ["llama-cache", "a.b_c-1", "a", "0", "A" * seg.MAX_NAME_CHARS, "x..y", "trailing."],
)
def test_valid_names(name: str) -> None:
    assert seg.validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/",
        ".",
        "..",
        ".hidden",
        "a/b",
        "../etc",
        "-dash",
        "_under",
        "has space",
        "tab\t",
        "nul\0",
        "é",
        "a" * (seg.MAX_NAME_CHARS + 1),
        None,
        5,
        b"llama",
        ["llama"],
    ],
)
def test_invalid_names(name: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        seg.validate_name(name)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", ["abc\n", "llama-cache\n"])
def test_validate_name_rejects_a_trailing_newline(name: str) -> None:
    """Regression: the name pattern ended in "$", which also matches before a final
    newline, so 'abc\\n' was accepted and became a file name with a newline."""
    with pytest.raises(InvalidArgument):
        seg.validate_name(name)


def test_bad_name_creates_nothing() -> None:
    before = sorted(os.listdir(seg.shm_dir()))
    for name in ("../escape", ".hidden", "a/b", "x\n"):
        with pytest.raises(InvalidArgument):
            kvcache.create(name, "1M")
        with pytest.raises(InvalidArgument):
            kvcache.open(name)
        with pytest.raises(InvalidArgument):
            kvcache.destroy(name)
    assert not Path("/dev/escape").exists()
    assert not Path("/dev/shm/kvcache.x\n").exists()
    after = sorted(os.listdir(seg.shm_dir()))
    assert not [f for f in set(after) - set(before) if "escape" in f or "hidden" in f]


def test_list_pools_ignores_hidden_and_odd_files(pool_name: str) -> None:
    odd = [
        seg.shm_dir() / f".kvcache.{pool_name}.0123456789ab",  # a create in progress
        seg.shm_dir() / f"kvcache.{pool_name}\n",  # newline: not a valid name
        seg.shm_dir() / f"kvcache.{pool_name} x",
    ]
    try:
        for path in odd:
            path.write_bytes(b"")
        assert not [n for n in kvcache.list_pools() if pool_name in n]
        with kvcache.create(pool_name, "64K"):
            listed = [n for n in kvcache.list_pools() if pool_name in n]
            assert listed == [pool_name]
    finally:
        for path in odd:
            path.unlink(missing_ok=True)
    assert kvcache.list_pools() == sorted(kvcache.list_pools())


# ----------------------------------------------------------------------- create


def test_default_mode_is_0600(
    make_pool: Callable[..., kvcache.Pool], pool_name: str, umask: Callable[[int], int]
) -> None:
    umask(0)  # a permissive umask must not widen a private pool
    make_pool("64K")
    assert _path(pool_name).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("mode", "force"),
    [(0o600, False), (0o640, False), (0o660, False), (0o604, True), (0o644, True), (0o666, True)],
)
def test_requested_mode_applies_regardless_of_umask(
    make_pool: Callable[..., kvcache.Pool],
    pool_name: str,
    umask: Callable[[int], int],
    mode: int,
    force: bool,
) -> None:
    umask(0o077)
    make_pool("64K", mode=mode, force=force)
    assert _path(pool_name).stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("mode", [-1, 0o1000, 0o4755, "0600", 1.5, True])
def test_bad_mode(pool_name: str, mode: object) -> None:
    with pytest.raises(InvalidArgument, match="mode"):
        kvcache.create(pool_name, "64K", mode=mode)  # type: ignore[arg-type]
    assert _traces(pool_name) == []


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (0o777, "execute"),
        (0o700, "execute"),
        (0o670, "execute"),
        (0o601, "execute"),
        (0o400, "owner read and write"),
        (0o060, "owner read and write"),  # "--mode 60", a typo for 660
        (0o000, "owner read and write"),
    ],
)
def test_unsafe_mode_is_refused_even_with_force(pool_name: str, mode: int, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        kvcache.create(pool_name, "64K", mode=mode, force=True)
    assert _traces(pool_name) == []


@pytest.mark.parametrize("mode", [0o666, 0o606, 0o604, 0o662])
def test_access_for_other_users_needs_force(pool_name: str, mode: int) -> None:
    """World-readable KV leaks prompts; world-writable KV lets anyone poison every engine."""
    with pytest.raises(InvalidArgument, match="force"):
        kvcache.create(pool_name, "64K", mode=mode)
    assert _traces(pool_name) == []


def test_create_is_exclusive(make_pool: Callable[..., kvcache.Pool], pool_name: str) -> None:
    pool = make_pool("64K")
    pool.put("k", b"v")
    with pytest.raises(PoolExistsError) as info:
        kvcache.create(pool_name, "1M")
    assert isinstance(info.value, FileExistsError)
    assert pool.get("k") == b"v"  # the first pool is untouched
    assert _traces(pool_name) == [f"kvcache.{pool_name}"]


def test_failed_initialise_leaves_nothing(pool_name: str) -> None:
    def initialise(segment: seg.Segment) -> None:
        assert _traces(pool_name)  # the hidden temporary exists meanwhile...
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        seg.create(pool_name, 1 << 20, 4096, 0o600, initialise)
    assert _traces(pool_name) == []  # ...and is gone


def test_losing_a_create_race_leaves_the_winner_alone(pool_name: str) -> None:
    """The name is taken between the existence check and the final link()."""

    def initialise(segment: seg.Segment) -> None:
        _path(pool_name).write_bytes(b"the winner")

    with pytest.raises(PoolExistsError):
        seg.create(pool_name, 1 << 20, 4096, 0o600, initialise)
    assert _traces(pool_name) == [f"kvcache.{pool_name}"]
    assert _path(pool_name).read_bytes() == b"the winner"


def test_create_larger_than_dev_shm_fails_cleanly(pool_name: str) -> None:
    fs = os.statvfs(seg.shm_dir())
    capacity = fs.f_blocks * fs.f_frsize
    with pytest.raises(OutOfSharedMemoryError) as info:
        kvcache.create(pool_name, capacity + G)
    assert isinstance(info.value, OSError)
    assert "/dev/shm" in str(info.value)
    assert _traces(pool_name) == []


def test_16g_pool_is_created_fast_and_sparse(pool_name: str) -> None:
    size = 16 * G
    fs = os.statvfs(seg.shm_dir())
    assert fs.f_blocks * fs.f_frsize > size, "this test needs a /dev/shm larger than 16 GiB"
    free_before = fs.f_bavail * fs.f_frsize
    started = time.perf_counter()
    pool = kvcache.create(pool_name, "16G")
    elapsed = time.perf_counter() - started
    try:
        geometry = pool._engine.views.geometry
        info = _path(pool_name).stat()
        free_after = os.statvfs(seg.shm_dir()).f_bavail * os.statvfs(seg.shm_dir()).f_frsize
        assert elapsed < 1.0
        assert info.st_size == geometry.total_bytes > size
        assert info.st_blocks * 512 <= geometry.metadata_bytes  # only metadata is backed
        assert geometry.metadata_bytes / size < 0.01
        assert free_before - free_after < 1 * G  # (other processes may use /dev/shm too)
        pool.put("first", b"x" * 1000)  # the first put backs one granule, not the pool
        assert _path(pool_name).stat().st_blocks * 512 < geometry.metadata_bytes + (64 << 20)
        assert pool.get("first") == b"x" * 1000
    finally:
        pool.close()


def test_metadata_overhead_of_1g_pool_is_below_one_percent() -> None:
    geometry = Geometry.for_config(kvcache.PoolConfig.build("1G"))
    assert geometry.metadata_bytes / G < 0.01


def test_prealloc_reserves_everything(
    make_pool: Callable[..., kvcache.Pool], pool_name: str
) -> None:
    pool = make_pool("8M", prealloc=True)
    info = _path(pool_name).stat()
    assert info.st_blocks * 512 >= info.st_size == pool._engine.views.geometry.total_bytes
    assert int(pool._engine.views.header["reserved_pages"]) == pool._engine.table.num_pages


def test_without_prealloc_only_metadata_is_backed(
    make_pool: Callable[..., kvcache.Pool], pool_name: str
) -> None:
    pool = make_pool("64M")
    info = _path(pool_name).stat()
    assert info.st_blocks * 512 <= pool._engine.views.geometry.metadata_bytes
    assert int(pool._engine.views.header["reserved_pages"]) == 0


# ----------------------------------------------------------------------- attach


def test_open_missing_pool(pool_name: str) -> None:
    with pytest.raises(PoolNotFoundError) as info:
        kvcache.open(pool_name)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(PoolNotFoundError):
        kvcache.destroy(pool_name)


def test_open_a_created_pool(make_pool: Callable[..., kvcache.Pool], pool_name: str) -> None:
    pool = make_pool("1M", page_size="4K", policy="lfu")
    pool.put("k", b"v")
    with kvcache.open(pool_name) as other:
        assert other.config == pool.config
        assert other.get("k") == b"v"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"x",
        os.urandom(100),
        os.urandom(4096),
        os.urandom(3 * 4096 + 17),
        b"KVCACHE1" + os.urandom(8192),  # the magic, then garbage
        b"\0" * 65536,
    ],
    ids=["empty", "one-byte", "100-random", "4096-random", "odd-random", "magic+garbage", "zeros"],
)
def test_a_file_that_is_not_a_pool(pool_name: str, content: bytes) -> None:
    _path(pool_name).write_bytes(content)
    with pytest.raises(IncompatiblePoolError):
        kvcache.open(pool_name)
    assert _path(pool_name).read_bytes() == content  # left as it was


def test_a_symlink_is_not_a_pool(make_pool: Callable[..., kvcache.Pool], pool_name: str) -> None:
    make_pool("64K")  # even a link to a real pool is refused
    link = seg.shm_dir() / f"kvcache.{pool_name}-link"
    link.symlink_to(_path(pool_name))
    try:
        with pytest.raises(IncompatiblePoolError, match="symbolic link"):
            kvcache.open(f"{pool_name}-link")
    finally:
        link.unlink()


def test_a_directory_is_not_a_pool(pool_name: str) -> None:
    """Regression: a directory at the pool's path raised IsADirectoryError."""
    _path(pool_name).mkdir()
    try:
        with pytest.raises(IncompatiblePoolError, match="directory"):
            kvcache.open(pool_name)
        with pytest.raises(IncompatiblePoolError, match="directory"):
            kvcache.destroy(pool_name)
    finally:
        _path(pool_name).rmdir()


def test_a_fifo_is_not_a_pool(pool_name: str) -> None:
    os.mkfifo(_path(pool_name))
    with pytest.raises(IncompatiblePoolError):
        kvcache.open(pool_name)


def _rewrite_header(name: str, field: str, value: object) -> None:
    with open(_path(name), "r+b") as f:
        header = np.frombuffer(bytearray(f.read(HEADER_DTYPE.itemsize)), HEADER_DTYPE)[0].copy()
        header[field] = value
        f.seek(0)
        f.write(header.tobytes())


def _closed_pool(name: str) -> None:
    kvcache.create(name, "1M", page_size="4K").close()


def test_other_format_version(pool_name: str) -> None:
    _closed_pool(pool_name)
    _rewrite_header(pool_name, "format_version", FORMAT_VERSION + 1)
    with pytest.raises(IncompatiblePoolError, match="version"):
        kvcache.open(pool_name)


def test_other_magic(pool_name: str) -> None:
    _closed_pool(pool_name)
    _rewrite_header(pool_name, "magic", b"KVCACHE0")
    with pytest.raises(IncompatiblePoolError, match="not a kvcache pool"):
        kvcache.open(pool_name)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_pages", 10**6),
        ("num_pages", -1),
        ("page_size_bytes", 3000),
        ("page_size_bytes", 8192),
        ("index_slots", 7),
        ("data_offset", 0),
        ("total_bytes", 1 << 62),
        ("max_entries", 0),
        ("policy", b"nosuch"),
    ],
)
def test_damaged_geometry(pool_name: str, field: str, value: object) -> None:
    _closed_pool(pool_name)
    _rewrite_header(pool_name, field, value)
    with pytest.raises(IncompatiblePoolError, match="damaged header"):
        kvcache.open(pool_name)


@pytest.mark.parametrize("delta", [-4096, 4096, 1])
def test_file_size_must_match_the_geometry(pool_name: str, delta: int) -> None:
    _closed_pool(pool_name)
    size = _path(pool_name).stat().st_size
    os.truncate(_path(pool_name), size + delta)
    with pytest.raises(IncompatiblePoolError, match="damaged header"):
        kvcache.open(pool_name)


def test_destroy_frees_the_name_and_stops_open_handles(
    make_pool: Callable[..., kvcache.Pool], pool_name: str
) -> None:
    """Open handles used to go on storing into the unlinked file, where no one else
    could ever see their work; now their next call says what happened."""
    pool = make_pool("64K", page_size="1K")
    pool.put("k", b"v")
    kvcache.destroy(pool_name)  # this process's own handles do not count as others
    assert _traces(pool_name) == []
    with pytest.raises(kvcache.PoolDestroyedError, match=r"was destroyed.*kvcache\.open"):
        pool.put("k2", b"v2")
    with pytest.raises(kvcache.PoolClosedError, match="was destroyed"):
        pool.get("k")
    assert "destroyed" in repr(pool)
    with kvcache.create(pool_name, "64K", page_size="1K") as fresh:  # the name is free again
        assert fresh.get("k") is None
        fresh.put("k", b"new")
        with pytest.raises(kvcache.PoolDestroyedError):
            pool.get("k")  # the old handle never reaches the new pool
    pool.close()


def _as_nobody(action: Callable[[], object]) -> str:
    """Run ``action`` in a forked child that is user ``nobody``; what it raised (or "returned").

    Forked rather than spawned: the interpreter lives where ``nobody`` may not read, so
    everything the action needs is imported before the fork.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        outcome = "returned"
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            action()
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, outcome.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become another user")
def test_regression_destroying_another_users_pool_raised_permission_error(
    make_pool: Callable[..., kvcache.Pool], pool_name: str
) -> None:
    """/dev/shm is sticky: only a pool's owner (or root) may remove it."""
    make_pool().put("k", b"root's")
    outcome = _as_nobody(lambda: kvcache.destroy(pool_name))
    # destroy opens the pool first (to refuse it while others have it open), so the
    # refusal comes from that open, which root's mode 0600 does not allow
    assert outcome.startswith(f"NotOwnerError: pool '{pool_name}' belongs to another user (root)")
    assert "ask its owner" in outcome
    with kvcache.open(pool_name) as pool:
        assert pool.get("k") == b"root's"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become another user")
def test_regression_restore_replacing_another_users_pool_raised_permission_error(
    make_pool: Callable[..., kvcache.Pool], pool_name: str
) -> None:
    """The restore is built under a hidden name, then renamed over the pool: refused, and
    the hidden file is removed."""
    make_pool().put("k", b"root's")

    def restore_over_roots_pool() -> None:
        folder = Path(tempfile.mkdtemp())  # nobody's own, in /tmp
        with kvcache.create(f"{pool_name}-nobody", "1M") as own:
            own.put("k", b"nobody's")
            snapshot = kvcache.persist(own, folder / "own.kvsnap")
        kvcache.destroy(f"{pool_name}-nobody")
        try:
            kvcache.restore(pool_name, snapshot, replace=True)
        finally:
            snapshot.unlink()
            folder.rmdir()

    outcome = _as_nobody(restore_over_roots_pool)
    assert outcome.startswith(f"NotOwnerError: pool '{pool_name}' belongs to another user (root)")
    assert _traces(pool_name) == [f"kvcache.{pool_name}"]
    with kvcache.open(pool_name) as pool:
        assert pool.get("k") == b"root's"
