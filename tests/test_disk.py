"""Disk pools: real files in real disk folders, found by name through the registry."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import registry, segment
from kvcache.layout import ENTRY_WORDS, HEADER_BYTES, E, Geometry, H

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a filesystem needs root")


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Pool names for a test; whatever pools carry them are destroyed afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        with contextlib.suppress(kvcache.KVCacheError):
            kvcache.destroy(name, force=True)


def _name(names: list[str]) -> str:
    names.append(f"disk-{uuid.uuid4().hex[:10]}")
    return names[-1]


def _header_word(path: Path, word: int) -> int:
    with open(path, "rb") as f:
        return int(np.frombuffer(f.read(HEADER_BYTES), "<i8")[word])


@contextlib.contextmanager
def _mounted(target: Path, *options: str) -> Iterator[Path]:
    target.mkdir(exist_ok=True)
    subprocess.run(["mount", *options, str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True, capture_output=True)


def test_a_disk_pool_is_a_file_in_its_folder_found_by_name(disk, names, private_home):
    name = _name(names)
    with kvcache.create(name, "4M", tier="disk", path=disk) as pool:
        pool.put("k", b"v" * 1000)
        assert pool.tier == "disk" and pool.path == disk / f"kvcache.{name}"
        assert pool.verify_reads  # forced on for disk pools
    file = disk / f"kvcache.{name}"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    record = private_home / "pools" / name
    assert record.read_text() == str(disk)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.stat().st_mode) == 0o700
    assert not (segment.shm_dir() / f"kvcache.{name}").exists()
    assert name in kvcache.list_pools()
    with kvcache.open(name) as pool:
        assert pool.get("k") == b"v" * 1000
    kvcache.destroy(name)
    assert not file.exists() and not record.exists()
    assert name not in kvcache.list_pools()


def test_without_a_path_a_disk_pool_goes_under_kvcache_home(names, private_home):
    if segment.tier_of(private_home) != "disk":
        pytest.skip("$KVCACHE_HOME is not on a disk here")
    name = _name(names)
    with kvcache.create(name, "1M", tier="disk") as pool:
        assert pool.path == private_home / "disk" / f"kvcache.{name}"
    assert stat.S_IMODE((private_home / "disk").stat().st_mode) == 0o700


def test_a_relative_path_is_recorded_as_the_absolute_folder(disk, names, monkeypatch):
    name = _name(names)
    monkeypatch.chdir(disk.parent)
    kvcache.create(name, "1M", tier="disk", path=disk.name).close()
    assert registry.lookup(name) == disk
    monkeypatch.chdir("/")
    kvcache.open(name).close()


def test_one_name_is_one_pool_across_tiers(disk, names):
    name = _name(names)
    kvcache.create(name, "1M").close()  # shared memory
    with pytest.raises(kvcache.PoolExistsError, match="already exists"):
        kvcache.create(name, "1M", tier="disk", path=disk)
    assert not (disk / f"kvcache.{name}").exists() and registry.lookup(name) is None
    other = _name(names)
    kvcache.create(other, "1M", tier="disk", path=disk).close()
    with pytest.raises(kvcache.PoolExistsError, match=str(disk)):
        kvcache.create(other, "1M")
    with pytest.raises(kvcache.PoolExistsError):
        kvcache.create(other, "1M", tier="disk", path=disk)
    assert not (segment.shm_dir() / f"kvcache.{other}").exists()


@pytest.mark.parametrize(
    ("tier", "where", "message"),
    [
        ("disk", "missing", "does not exist"),
        ("disk", "file", "is not a folder"),
        ("disk", "ram", "is in RAM"),
        ("cpu", "disk", "is on a disk"),
        ("tape", "disk", "unknown tier"),
    ],
)
def test_bad_folders_are_refused_and_leave_nothing(disk, names, tier, where, message):
    name = _name(names)
    (disk / "a-file").write_bytes(b"")
    path = {
        "missing": disk / "nope",
        "file": disk / "a-file",
        "ram": segment.shm_dir() if segment.tier_of() == "cpu" else Path("/dev/shm"),
        "disk": disk,
    }[where]
    if where == "ram" and segment.tier_of(path) != "cpu":
        pytest.skip("no RAM-backed folder here")
    with pytest.raises(kvcache.InvalidArgument, match=message):
        kvcache.create(name, "1M", tier=tier, path=path)
    assert name not in kvcache.list_pools()
    assert sorted(os.listdir(disk)) == ["a-file"]


@needs_root
def test_a_read_only_folder_is_refused(disk, names, tmp_path):
    name = _name(names)
    with _mounted(tmp_path / "ro", "--bind", "-o", "ro", str(disk)) as ro:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        with pytest.raises(kvcache.InvalidArgument, match="not writable"):
            kvcache.create(name, "1M", tier="disk", path=ro)
    assert name not in kvcache.list_pools()


def test_warm_after_every_process_closed_it(disk, names):
    name = _name(names)
    with kvcache.create(name, "8M", tier="disk", path=disk, page_size="4K") as pool:
        for i in range(200):
            pool.put(f"k{i}", bytes([i % 256]) * (100 + 97 * i))
        assert _header_word(pool.path, H.clean) == 0  # open: not clean
    file = disk / f"kvcache.{name}"
    assert _header_word(file, H.clean) == 1  # the last close flushed it and marked it
    with kvcache.open(name) as pool:
        stats = pool.stats()
        assert (stats.num_entries, stats.repairs, stats.damaged) == (200, 0, 0)
        assert all(pool.get(f"k{i}") == bytes([i % 256]) * (100 + 97 * i) for i in range(200))
        assert pool.check() == []


def test_a_second_handle_closing_does_not_mark_it_clean(disk, names):
    name = _name(names)
    first = kvcache.create(name, "1M", tier="disk", path=disk)
    kvcache.open(name).close()
    assert _header_word(first.path, H.clean) == 0
    first.close()
    assert _header_word(disk / f"kvcache.{name}", H.clean) == 1


def test_an_unclean_file_is_repaired_at_first_open(disk, names):
    """clean == 0 with nobody attached: a kill, a power loss or a copy; open repairs."""
    name = _name(names)
    with kvcache.create(name, "1M", tier="disk", path=disk) as pool:
        pool.put("k", b"value")
    file = disk / f"kvcache.{name}"
    with open(file, "r+b") as f:
        os.pwrite(f.fileno(), (0).to_bytes(8, "little"), H.clean * 8)
    with kvcache.open(name) as pool:
        assert pool.stats().repairs == 1
        assert pool.get("k") == b"value"
        assert pool.check() == []


_MID_OPEN_CHILD = textwrap.dedent(
    """
    import os, sys
    from kvcache import leases
    from kvcache.layout import H
    # What an opener holds between claiming its slot and finishing its open: the
    # slot's lease and its identity, not yet the "opened" lease.
    fd = os.open(sys.argv[1], os.O_RDWR)
    procs_offset = int.from_bytes(os.pread(fd, 8, H.procs_offset * 8), "little")
    assert leases.try_hold(fd, procs_offset)  # slot 0
    os.pwrite(fd, (1).to_bytes(8, "little"), procs_offset + 24)  # pid_ns: slot in use
    print("claimed", flush=True)
    sys.stdin.read()
    """
)


def test_an_opener_still_mid_open_does_not_stop_the_repair(disk, names):
    """Regression: two openers of an unclean pool each saw the other and neither repaired."""
    name = _name(names)
    with kvcache.create(name, "1M", tier="disk", path=disk) as pool:
        pool.put("k", b"value")
    file = disk / f"kvcache.{name}"
    with open(file, "r+b") as f:
        os.pwrite(f.fileno(), (0).to_bytes(8, "little"), H.clean * 8)
    child = subprocess.Popen(
        [sys.executable, "-c", _MID_OPEN_CHILD, str(file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "claimed"
        with kvcache.open(name) as pool:
            assert pool.stats().repairs == 1
            assert pool.get("k") == b"value"
            with kvcache.open(name) as second:  # an open that finished: no second repair
                assert second.stats().repairs == 1
    finally:
        child.communicate("", timeout=30)


def test_flipped_bytes_in_a_data_page_are_a_miss_and_counted(disk, names):
    name = _name(names)
    value = bytes(range(256)) * 64
    with kvcache.create(name, "1M", tier="disk", path=disk, page_size="16K") as pool:
        pool.put("victim", value)
        pool.put("bystander", b"b" * 5000)
        data_offset = Geometry.for_config(pool.config).data_offset
    first_page = data_offset  # the first put took page 0
    with open(disk / f"kvcache.{name}", "r+b") as f:
        spot = first_page + 1000
        old = os.pread(f.fileno(), 1, spot)
        os.pwrite(f.fileno(), bytes([old[0] ^ 0xFF]), spot)
    with kvcache.open(name) as pool:
        assert pool.get("victim") is None
        assert "victim" not in pool
        assert pool.stats().damaged == 1
        assert pool.get("bystander") == b"b" * 5000
        assert pool.check() == []


def test_flush_then_a_copy_opens_with_every_entry(disk, names, tmp_path):
    """What flush() wrote is in the file (a copy taken now has it all)."""
    name, copy = _name(names), _name(names)
    other = tmp_path / "elsewhere"
    other.mkdir()
    with kvcache.create(name, "4M", tier="disk", path=disk) as pool:
        for i in range(20):
            pool.put(f"k{i}", str(i).encode() * 1000)
        pool.flush()
        shutil.copyfile(pool.path, other / f"kvcache.{copy}")
    kvcache.adopt(copy, other)
    with kvcache.open(copy) as pool:
        assert pool.stats().repairs == 1  # copied while open: not clean
        assert all(pool.get(f"k{i}") == str(i).encode() * 1000 for i in range(20))
        assert pool.check() == []


def test_adopt_registers_a_pool_file_again_after_home_was_lost(disk, names, tmp_path, monkeypatch):
    name = _name(names)
    with kvcache.create(name, "1M", tier="disk", path=disk) as pool:
        pool.put("k", b"v")
    monkeypatch.setenv("KVCACHE_HOME", str(tmp_path / "new-home"))
    assert name not in kvcache.list_pools()
    with pytest.raises(kvcache.PoolExistsError, match="adopt"):
        kvcache.create(name, "1M", tier="disk", path=disk)
    kvcache.adopt(name, disk)
    with kvcache.open(name) as pool:
        assert pool.get("k") == b"v"
    with pytest.raises(kvcache.PoolExistsError):
        kvcache.adopt(name, disk)
    with pytest.raises(kvcache.PoolNotFoundError):
        kvcache.adopt(_name(names), disk)


def test_a_record_whose_file_is_gone_is_listed_and_destroy_forgets_it(disk, names):
    name = _name(names)
    kvcache.create(name, "1M", tier="disk", path=disk).close()
    (disk / f"kvcache.{name}").unlink()
    assert name in kvcache.list_pools()
    with pytest.raises(kvcache.PoolNotFoundError, match="is gone"):
        kvcache.open(name)
    kvcache.destroy(name)
    assert name not in kvcache.list_pools() and registry.lookup(name) is None


def test_a_damaged_record_is_a_clear_error_and_destroy_forgets_it(names, private_home):
    name = _name(names)
    (private_home / "pools").mkdir(mode=0o700)
    (private_home / "pools" / name).write_text("not/absolute")
    with pytest.raises(kvcache.IncompatiblePoolError, match="damaged"):
        kvcache.open(name)
    kvcache.destroy(name)
    assert name not in kvcache.list_pools()


def test_restore_into_a_disk_folder_and_replace_keeps_it_there(disk, names, tmp_path):
    name = _name(names)
    with kvcache.create(name, "2M") as pool:  # shared memory
        pool.put("k", b"v" * 3000)
        snapshot = kvcache.persist(pool, tmp_path / "s.kvsnap")
    with kvcache.restore(name, snapshot, replace=True, tier="disk", folder=disk) as pool:
        assert pool.tier == "disk" and pool.get("k") == b"v" * 3000
    assert not (segment.shm_dir() / f"kvcache.{name}").exists()  # moved, not copied
    with kvcache.restore(name, snapshot, replace=True) as pool:  # default: where it was
        assert pool.path == disk / f"kvcache.{name}"
    with kvcache.open(name) as pool:
        assert pool.stats().repairs == 0 and pool.get("k") == b"v" * 3000


def test_restore_refuses_a_folder_that_does_not_match_its_tier(disk, names, tmp_path):
    name = _name(names)
    with kvcache.create(name, "1M") as pool:
        snapshot = kvcache.persist(pool, tmp_path / "s.kvsnap")
    with pytest.raises(kvcache.InvalidArgument, match="is on a disk"):
        kvcache.restore(name, snapshot, replace=True, tier="cpu", folder=disk)
    assert os.listdir(disk) == []


# ------------------------------------------------------------------ full device


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB ext4 filesystem on a loop device, mounted for the test (root only)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("a loop-device filesystem needs root and mkfs.ext4")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    try:
        with _mounted(tmp_path / "small", "-o", "loop", str(image)) as mount:
            yield mount
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot mount a loop device here: {exc.stderr.decode().strip()}")


def _fill(folder: Path, leave_bytes: int) -> None:
    """Take the folder's free space down to about ``leave_bytes``."""
    fs = os.statvfs(folder)
    free = fs.f_bavail * fs.f_frsize
    with open(folder / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, free - leave_bytes))


@needs_root
def test_a_full_disk_is_a_clear_error_and_puts_evict_within_reserved(small_disk, names):
    name = _name(names)
    with kvcache.create(name, "16M", tier="disk", path=small_disk, page_size="64K") as pool:
        pool.put("first", b"a" * (4 << 20))  # reserves 8 MiB of pages
        _fill(small_disk, 1 << 20)
        for i in range(6):  # more than the reserved pages hold: earlier entries make way
            pool.put(f"k{i}", bytes([i]) * (2 << 20))
        assert pool.stats().evictions > 0
        assert pool.get("k5") == bytes([5]) * (2 << 20)
        with pytest.raises(kvcache.OutOfSharedMemoryError, match="disk space"):
            pool.put("huge", b"h" * (12 << 20))  # larger than every reserved page
        assert pool.check() == []


@needs_root
def test_create_prealloc_on_a_full_disk_is_a_clear_error(small_disk, names):
    name = _name(names)
    _fill(small_disk, 2 << 20)
    with pytest.raises(kvcache.NotEnoughMemoryError, match="disk space"):
        kvcache.create(name, "16M", tier="disk", path=small_disk, prealloc=True)
    assert name not in kvcache.list_pools()
    assert sorted(os.listdir(small_disk)) == ["filler", "lost+found"]


def test_a_pool_larger_than_its_disk_is_refused(disk, names):
    capacity = os.statvfs(disk).f_blocks * os.statvfs(disk).f_frsize
    with pytest.raises(kvcache.OutOfSharedMemoryError, match="another --path"):
        kvcache.create(_name(names), capacity * 2, tier="disk", path=disk)


# ------------------------------------------------------------ no limit from RAM

_RSS_CHILD = textwrap.dedent(
    """
    import json, sys
    import kvcache

    def memory():
        fields = {}
        for line in open("/proc/self/status"):
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) << 10
        return fields

    name, folder, size, gib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    value_bytes = 1 << 20
    with kvcache.create(name, size, tier="disk", path=folder) as pool:
        for i in range(gib << 10):
            pool.put(i.to_bytes(4, "little"), bytes([i % 251]) * value_bytes)
        after_puts = memory()
        buffer = bytearray(value_bytes)
        for i in range(gib << 10):
            assert pool.get_into(i.to_bytes(4, "little"), buffer) == value_bytes
            assert buffer[0] == buffer[-1] == i % 251
        after_gets = memory()
        assert pool.stats().num_entries == gib << 10
    print(json.dumps({"after_puts": after_puts, "after_gets": after_gets}))
    """
)
RSS_BOUND_BYTES = 768 << 20
"""Budget (256 MiB of mapped pages) + metadata pages touched + the interpreter and numpy."""


def test_a_64g_disk_pool_on_a_smaller_machine_keeps_rss_bounded(disk, names):
    fs = os.statvfs(disk)
    if fs.f_blocks * fs.f_frsize < 65 << 30 or fs.f_bavail * fs.f_frsize < 8 << 30:
        pytest.skip("needs a disk of over 64 GiB with 8 GiB free under tmp_path")
    name = _name(names)
    result = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, name, str(disk), "64G", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    print(figures)  # with -s: the measured RssFile/RssAnon
    for stage in ("after_puts", "after_gets"):
        assert figures[stage]["VmHWM"] < RSS_BOUND_BYTES, figures
    assert (disk / f"kvcache.{name}").stat().st_size > 64 << 30


# ------------------------------------------------------------ large values read from the file


def _fragmented_pool(disk: Path, names: list[str]) -> kvcache.Pool:
    """A disk pool whose next large value lies over several runs of pages."""
    pool = kvcache.create(_name(names), "4M", tier="disk", path=disk, page_size="64K")
    for i in range(8):
        pool.put(f"filler{i}", b"f" * 100_000)  # two pages each
    for i in range(0, 8, 2):
        pool.delete(f"filler{i}")  # holes of two pages between live entries
    return pool


def _runs_of(pool: kvcache.Pool, key: str) -> int:
    _, payload, _ = pool._engine.table.value_views(
        pool._engine.table.find(key.encode()), from_file=True
    )
    assert payload.fd >= 0  # read from the file, not through the mapping
    return len(payload.file_spans)


@pytest.mark.parametrize("kind", ["bytes", "array", "get_into"])
def test_a_large_value_over_several_runs_reads_back_from_the_file(disk, names, kind):
    values = {
        "bytes": np.random.default_rng(1).bytes(300_000),
        "array": np.random.default_rng(2).standard_normal(40_000),
        "get_into": np.random.default_rng(3).bytes(300_000),
    }
    value = values[kind]
    with _fragmented_pool(disk, names) as pool:
        pool.put("big", value)
        assert _runs_of(pool, "big") > 1
        if kind == "get_into":
            buffer = bytearray(len(value) + 10)
            assert pool.get_into("big", buffer) == len(value)
            assert bytes(buffer[: len(value)]) == value
        elif kind == "array":
            np.testing.assert_array_equal(pool.get("big"), value)
        else:
            assert pool.get("big") == value
        assert pool.stats().damaged == 0


@pytest.mark.parametrize("kind", ["bytes", "array", "get_into"])
def test_a_flipped_byte_in_a_large_value_on_disk_is_a_miss_and_counted(disk, names, kind):
    with _fragmented_pool(disk, names) as pool:
        value = np.arange(50_000, dtype=np.float64) if kind == "array" else b"v" * 400_000
        pool.put("big", value)
        _, payload, _ = pool._engine.table.value_views(
            pool._engine.table.find(b"big"), from_file=True
        )
        offset, length = payload.file_spans[-1]
        spot = offset + length - 1  # the value's last byte, in its last run
        os.pwrite(payload.fd, bytes([os.pread(payload.fd, 1, spot)[0] ^ 0xFF]), spot)
        if kind == "get_into":
            assert pool.get_into("big", bytearray(400_000)) is None
        else:
            assert pool.get("big") is None
        assert pool.stats().damaged == 1
        assert "big" not in pool
        assert pool.get("filler1") == b"f" * 100_000


@pytest.mark.parametrize("elements", [100, 50_000], ids=["inline", "from-file"])
def test_a_damaged_array_header_on_disk_is_a_miss_not_an_error(disk, names, elements):
    """CI found it: a copy of a disk pool taken while writers ran held an entry whose
    array header no longer decoded; the read raised CorruptPoolError instead of a miss."""
    with _fragmented_pool(disk, names) as pool:
        pool.put("big", np.arange(elements, dtype=np.float64))
        eid = pool._engine.table.find(b"big")
        first_page, key_len = (
            pool._engine.views.entries_q[eid * ENTRY_WORDS + field]
            for field in (E.first_page, E.key_len)
        )
        spot = (
            pool._engine.table.data_offset + first_page * pool._engine.table.page_size + key_len + 2
        )
        fd = pool._segment.fd
        os.pwrite(fd, b"\xe7", spot)  # the dtype text's first byte: no longer ASCII
        assert pool.get("big") is None
        assert pool.stats().damaged == 1
        assert "big" not in pool
        assert pool.get("filler1") == b"f" * 100_000


def test_a_truncated_pool_file_is_reported_as_damage_not_a_short_value(disk, names):
    with kvcache.create(_name(names), "4M", tier="disk", path=disk, page_size="64K") as pool:
        pool.put("big", b"x" * 1_000_000)
        _, payload, _ = pool._engine.table.value_views(
            pool._engine.table.find(b"big"), from_file=True
        )
        offset, _ = payload.file_spans[0]
        os.truncate(pool.path, offset + 500_000)  # keeps the key's page, cuts the value
        with pytest.raises(kvcache.CorruptPoolError, match="shorter than its pages"):
            pool.get("big")
        with pytest.raises(kvcache.CorruptPoolError, match="shorter than its pages"):
            pool.get_into("big", bytearray(1_000_000))


def _drop_data_pages(pool: kvcache.Pool) -> None:
    """Flush ``pool`` and drop its data pages from the page cache (unmapped ones)."""
    pool.flush()
    fd = os.open(pool.path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, pool._engine.table.data_offset, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _bytes_read_by(action) -> int:
    """Bytes this process asked its disks for while ``action()`` ran."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_inblock
    action()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_inblock - before) * 512


@pytest.mark.parametrize("size", [4096, 1 << 20])
def test_a_cold_get_reads_the_file_and_faults_in_nothing(disk, names, size):
    """Regression: a lookup compared the key through the mapping, so on a cold page it
    took a major fault that read a value's worth around it, under the lock (a cold 1 MiB
    get took 5.0 ms, 1.2 ms now; 4 KiB values spread over 1 GiB, 4.6 ms, 0.13 ms now)."""
    value = np.random.default_rng(4).bytes(size)
    name = _name(names)
    with kvcache.create(name, "16M", tier="disk", path=disk) as pool:
        pool.put("k", value)
    with kvcache.open(name) as pool:
        _drop_data_pages(pool)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        assert pool.get("k") == value
        assert resource.getrusage(resource.RUSAGE_SELF).ru_majflt == faults


def test_a_cold_promotion_from_a_disk_pool_reads_only_the_entry(disk, names):
    """A get above that finds its value in a cold disk pool below asks for the entry's
    pages in one go before it copies them up, and reads nothing around them (a promoted
    cold 1 MiB get: 5.6 -> 2.2 ms; without the request, 2 MiB were read)."""
    lower, upper = _name(names), _name(names)
    value = np.random.default_rng(5).bytes(1 << 20)
    kvcache.create(lower, "16M", tier="disk", path=disk).close()
    with kvcache.create(upper, "4M", spill_to=lower) as top:
        top.put("k", value)
        for i in range(4):
            top.put(f"filler{i}", b"f" * (1 << 20))  # "k" spills down
    with kvcache.open(upper) as top, kvcache.open(lower) as bottom:
        assert "k" in {entry.key for entry in bottom.entries()}
        top.evict(percent=100)  # room for "k": its promotion spills nothing down
        _drop_data_pages(bottom)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        got: list[bytes] = []
        read = _bytes_read_by(lambda: got.append(top.get("k")))
        assert got == [value] and top.stats().promotions == 1
        assert resource.getrusage(resource.RUSAGE_SELF).ru_majflt == faults
        assert read <= 17 * 64 << 10  # its 17 pages (the key shares the first), not 2 MiB


@pytest.mark.parametrize("through", ["alone", "chain"])
def test_read_ahead_asks_for_every_entry_at_once(disk, names, through):
    """``PrefixCache.retrieve`` reads its chunks one by one: asking for all of them first
    keeps the disk busy with every chunk at once, here or in a disk pool below."""
    rng = np.random.default_rng(6)
    values = {f"chunk{i}": rng.bytes(1 << 20) for i in range(4)}
    name = _name(names)
    with kvcache.create(name, "16M", tier="disk", path=disk) as pool:
        for key, value in values.items():
            pool.put(key, value)
    top = kvcache.create(_name(names), "4M", spill_to=name) if through == "chain" else None
    with kvcache.open(name) as pool:
        _drop_data_pages(pool)
        reader = top or pool
        asked = _bytes_read_by(lambda: reader.read_ahead([*values, "missing"]))
        assert 4 << 20 <= asked <= 4 * 17 * 64 << 10  # the four entries' pages, nothing more
        assert _bytes_read_by(lambda: [reader.get(key) for key in values]) == 0
        assert all(reader.get(key) == value for key, value in values.items())
    if top is not None:
        top.close()
