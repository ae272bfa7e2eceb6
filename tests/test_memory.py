"""memory: what RAM, cgroups and folders can still give, checked before every reservation.

The parsing tests read /proc-like layouts made up in ``tmp_path`` (``Room``
takes where procfs is); the others run against the real machine, real
tmpfs mounts and real disk folders. Real cgroups with limits are in
``multiprocess/test_memory_limits.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import NotEnoughMemoryError, memory, segment
from kvcache.allocator import RESERVE_GRANULE_BYTES
from kvcache.engine.eviction import GROWTH_RETRY_S
from kvcache.layout import Geometry, H

G, M = 1 << 30, 1 << 20
CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"


def _traces(name: str, folder: Path | None = None) -> list[str]:
    return [f for f in os.listdir(folder or segment.shm_dir()) if name in f]


def _mem_available() -> int:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"^MemAvailable: +(\d+) kB$", text, re.MULTILINE).group(1)) * 1024


# --------------------------------------------------------- made-up /proc layouts


class FakeProc:
    """A procfs stand-in: meminfo, self/cgroup and self/mountinfo, and cgroup folders."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        (self.proc / "self").mkdir(parents=True)
        self.meminfo(total=16 * G, available=8 * G)
        self.mounts: list[str] = ["25 24 0:23 / /dev/shm rw - tmpfs tmpfs rw"]
        self.write_mounts()

    def meminfo(self, *, total: int, available: int) -> None:
        (self.proc / "meminfo").write_text(
            f"MemTotal:       {total // 1024} kB\nMemFree:        1 kB\n"
            f"MemAvailable:   {available // 1024} kB\nBuffers:        0 kB\n"
        )

    def in_cgroups(self, *lines: str) -> None:
        (self.proc / "self" / "cgroup").write_text("".join(f"{line}\n" for line in lines))

    def mount(self, root: str, point: Path | str, fstype: str, options: str = "rw") -> None:
        escaped = str(point).replace(" ", "\\040")
        mount_id = 40 + len(self.mounts)
        self.mounts.append(f"{mount_id} 1 0:99 {root} {escaped} rw - {fstype} x {options}")
        self.write_mounts()

    def write_mounts(self) -> None:
        (self.proc / "self" / "mountinfo").write_text("".join(f"{m}\n" for m in self.mounts))

    def cgroup(self, folder: Path, files: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)

    def room(self) -> memory.Room:
        return memory.Room(Path("/dev/shm"), proc=self.proc)


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def _v2(limit: str, current: int, file_cache: int = 0) -> dict[str, str]:
    half = file_cache // 2
    stat = f"anon 1\nfile {file_cache}\nactive_file {half}\ninactive_file {file_cache - half}\n"
    return {"memory.max": limit, "memory.current": str(current), "memory.stat": stat}


def test_memavailable_keeps_a_margin(fake: FakeProc) -> None:
    fake.in_cgroups("0::/")
    [ram] = [limit for limit in fake.room().limits() if limit.source == "MemAvailable"]
    assert (ram.free_bytes, ram.margin_bytes, ram.room_bytes) == (8 * G, G, 7 * G)
    fake.room().require(7 * G, "pool 'x'", "do something")
    with pytest.raises(NotEnoughMemoryError) as info:
        fake.room().require(7 * G + 1, "pool 'x'", "choose a smaller --size")
    assert str(info.value) == (
        "pool 'x' needs 7.0G more memory but only 7.0G is available (MemAvailable 8.0G, "
        "less 1.0G kept free for other processes): choose a smaller --size"
    )
    assert isinstance(info.value, kvcache.OutOfSharedMemoryError)


def test_limits_are_read_again_once_a_sixteenth_of_the_room_is_used(fake: FakeProc) -> None:
    """Reading the limits costs 4% of filling a fresh pool if done at every 8 MiB; a
    Room trusts a reading for 1/16 of the room it found, and re-reads after that."""
    fake.in_cgroups("0::/")
    room = fake.room()
    room.require(G, "pool 'x'", "")  # 7 GiB of room: 6 GiB left, 384 MiB on credit
    fake.meminfo(total=16 * G, available=G)  # another process took 7 GiB meanwhile
    for _ in range(48):
        room.require(8 * M, "pool 'x'", "")  # on credit: the reading is not repeated
    with pytest.raises(NotEnoughMemoryError, match=r"only 0B is available"):
        room.require(8 * M, "pool 'x'", "evict")  # credit spent: a fresh reading refuses


def test_margin_is_a_gibibyte_or_a_sixteenth_of_small_limits() -> None:
    assert memory.margin_for(24 * G) == G
    assert memory.margin_for(1 << 40) == G
    assert memory.margin_for(2 * G) == 128 * M


def test_v2_a_parents_limit_binds_and_file_cache_counts_as_free(fake: FakeProc) -> None:
    """The leaf has no limit (``max``); its parent's 4 GiB does, with 1 GiB of it page
    cache (model weights read from disk) that the kernel drops before failing a charge."""
    cg = fake.root / "sys" / "fs" / "cgroup"
    fake.mount("/", cg, "cgroup2", "rw,nsdelegate")
    fake.in_cgroups("0::/kubepods/pod1/engine")
    fake.cgroup(cg, {"cgroup.procs": ""})  # the root: never limited, no memory.max
    fake.cgroup(cg / "kubepods", _v2("max", 10 * G))
    fake.cgroup(cg / "kubepods" / "pod1", _v2(str(4 * G), 3 * G + 512 * M, file_cache=G))
    fake.cgroup(cg / "kubepods" / "pod1" / "engine", _v2("max", 3 * G))
    room = fake.room()
    [pod] = [limit for limit in room.limits() if "cgroup" in limit.source]
    assert str(cg / "kubepods" / "pod1") in pod.source and "memory.max 4.0G" in pod.source
    assert (pod.free_bytes, pod.margin_bytes) == (G + 512 * M, 256 * M)
    with pytest.raises(NotEnoughMemoryError, match=r"only 1\.2G is available \(cgroup .*pod1"):
        room.require(2 * G, "pool 'x'", "raise the limit")


def test_v1_hierarchical_usage_and_file_cache(fake: FakeProc) -> None:
    cg = fake.root / "cgroup" / "memory"
    fake.mount("/", cg, "cgroup", "rw,memory")
    fake.mount("/", fake.root / "cgroup" / "cpu", "cgroup", "rw,cpu,cpuacct")
    fake.in_cgroups("5:cpu,cpuacct:/docker/abc", "4:memory:/docker/abc", "0::/")
    fake.cgroup(
        cg / "docker" / "abc",
        {
            "memory.limit_in_bytes": str(2 * G),
            "memory.usage_in_bytes": str(G),
            "memory.stat": "cache 5\ntotal_active_file 100\ntotal_inactive_file 28\n",
        },
    )
    fake.cgroup(cg / "docker", {"memory.limit_in_bytes": "9223372036854771712"})  # unlimited
    [limit] = [limit for limit in fake.room().limits() if "cgroup" in limit.source]
    assert (limit.free_bytes, limit.margin_bytes) == (G + 128, 128 * M)
    assert "memory.limit_in_bytes 2.0G" in limit.source


def test_a_container_sees_only_its_subtree_mounted(fake: FakeProc) -> None:
    """Without a cgroup namespace, /proc/self/cgroup shows the full path while the
    container's /sys/fs/cgroup is that path's subtree (mountinfo's root field)."""
    cg = fake.root / "sys" / "fs" / "cgroup"
    fake.mount("/kubepods/pod1", cg, "cgroup2")
    fake.in_cgroups("0::/kubepods/pod1/engine")
    fake.cgroup(cg, _v2(str(3 * G), G))  # the pod, at the mount point: it has a limit
    fake.cgroup(cg / "engine", _v2(str(2 * G), G + 900 * M))
    limits = {limit.free_bytes for limit in fake.room().limits() if "cgroup" in limit.source}
    assert limits == {2 * G, 124 * M}


def test_a_process_outside_the_mounted_subtree_reads_no_cgroup(fake: FakeProc) -> None:
    cg = fake.root / "cg"
    fake.mount("/other", cg, "cgroup2")
    fake.in_cgroups("0::/mine")
    fake.cgroup(cg, _v2(str(G), 0))
    assert not [limit for limit in fake.room().limits() if "cgroup" in limit.source]


def test_a_cgroup_removed_meanwhile_is_no_limit(fake: FakeProc) -> None:
    cg = fake.root / "cg"
    fake.mount("/", cg, "cgroup2")
    fake.in_cgroups("0::/gone")
    fake.cgroup(cg / "gone", _v2(str(G), 0))
    room = fake.room()
    shutil.rmtree(cg / "gone")
    assert not [limit for limit in room.limits() if "cgroup" in limit.source]


def test_filesystem_type_of_the_deepest_topmost_mount(fake: FakeProc, tmp_path: Path) -> None:
    spaced = tmp_path / "with space"
    fake.mounts = ["1 0 8:1 / / rw - ext4 /dev/sda rw"]
    fake.mount("/", tmp_path, "xfs")
    fake.mount("/", spaced, "ext4")
    fake.mount("/", spaced, "tmpfs")  # mounted over the ext4 one
    fake.mount("/", tmp_path / "ramdisk", "ramfs")
    types = {
        path: memory.filesystem_type(path, proc=fake.proc)
        for path in (spaced / "pools", tmp_path / "with", tmp_path / "ramdisk", Path("/etc"))
    }
    assert list(types.values()) == ["tmpfs", "xfs", "ramfs", "ext4"]
    assert memory.is_ram_backed(tmp_path / "ramdisk", proc=fake.proc)
    assert not memory.is_ram_backed(tmp_path / "with", proc=fake.proc)


def test_a_disk_folder_is_bounded_by_its_free_space_only(fake: FakeProc, tmp_path: Path) -> None:
    fake.mounts = ["1 0 8:1 / / rw - ext4 /dev/sda rw"]
    fake.write_mounts()
    fake.in_cgroups("0::/")
    room = memory.Room(tmp_path, proc=fake.proc)
    fs = os.statvfs(tmp_path)
    [disk] = room.limits()
    assert disk.source == f"free space of {tmp_path}"
    assert disk.free_bytes == pytest.approx(fs.f_bavail * fs.f_frsize, rel=0.01)
    assert disk.margin_bytes == memory.margin_for(fs.f_blocks * fs.f_frsize)


# ------------------------------------------------------------------ the real machine


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount_tmpfs("64m")``: a real tmpfs of that size for the test (these tests run as root)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            check=True,
            capture_output=True,
        )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=True, capture_output=True)


@pytest.fixture
def disk_folder(tmp_path: Path) -> Path:
    """A folder on a disk filesystem (the pytest temporary folder, unless that is in RAM)."""
    if memory.is_ram_backed(tmp_path):
        pytest.skip(f"{tmp_path} is in RAM here: no disk folder to test with")
    return tmp_path


def test_tiers_of_real_folders(mount_tmpfs: Callable[[str], Path], disk_folder: Path) -> None:
    assert segment.tier_of(Path("/dev/shm")) == "cpu"
    assert segment.tier_of(mount_tmpfs("1m") / "pools") == "cpu"
    assert segment.tier_of(disk_folder) == "disk"
    assert memory.Room(Path("/dev/shm")).ram_backed


def test_prealloc_beyond_what_the_machine_can_give_is_refused_leaving_nothing(pool_name):
    """Regression: ``create --size 20G --prealloc`` on a 24 GiB machine was OOM-killed
    (exit 137) and left a hidden 21.5 GiB file in /dev/shm. The size asked for here fits
    /dev/shm's size, so only the memory check stands between it and the OOM killer."""
    fs = os.statvfs(segment.shm_dir())
    size = int(fs.f_blocks * fs.f_frsize * 0.99)
    total = Geometry.for_config(kvcache.PoolConfig.build(size)).total_bytes
    if total > fs.f_blocks * fs.f_frsize or size < _mem_available() - memory.MARGIN_BYTES // 2:
        pytest.skip("needs a /dev/shm about as large as the RAM available")
    result = subprocess.run(
        [CORTEX, "cache", "create", pool_name, "--size", str(size), "--prealloc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert re.search(r"needs \S+ more memory but only \S+ is available \(", message), message
    assert "--prealloc" in message
    assert _traces(pool_name) == []


def test_restore_that_does_not_fit_is_refused_before_building(
    make_pool, pool_name, tmp_path, mount_tmpfs, monkeypatch
):
    """A restore checks the room for all its entries first, rather than failing when
    /dev/shm runs out most of the way through."""
    pool = make_pool("48M", page_size="64K")
    rng = np.random.default_rng(1)
    for i in range(40):
        pool.put(f"k{i}", rng.bytes(M))
    snapshot = kvcache.persist(pool, tmp_path / "pool.kvsnap")
    shm = mount_tmpfs("64m")
    (shm / "filler").write_bytes(bytes(30 * M))
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(shm))
    with pytest.raises(NotEnoughMemoryError) as info:
        kvcache.restore(f"{pool_name}-restored", snapshot)
    assert f"restoring pool '{pool_name}-restored' needs 42.5M more memory" in str(info.value)
    assert f"(free space of {shm} " in str(info.value)
    assert sorted(os.listdir(shm)) == ["filler"]


def test_a_pool_on_disk_is_bounded_by_the_disk(pool_name, disk_folder, monkeypatch) -> None:
    fs = os.statvfs(disk_folder)
    size = fs.f_bavail * fs.f_frsize
    if Geometry.for_config(kvcache.PoolConfig.build(size)).total_bytes > fs.f_blocks * fs.f_frsize:
        pytest.skip(f"{disk_folder}'s filesystem is nearly empty: nothing between free and size")
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(disk_folder))
    with pytest.raises(NotEnoughMemoryError) as info:
        kvcache.create(pool_name, size, prealloc=True)
    assert "more disk space but only" in str(info.value)
    assert f"(free space of {disk_folder} " in str(info.value)
    assert _traces(pool_name, disk_folder) == []
    with kvcache.create(pool_name, "1M", prealloc=True) as pool:  # what fits is fine
        pool.put("k", b"v")
    kvcache.destroy(pool_name)


def _fill_but(folder: Path, free_bytes: int) -> Path:
    """Take all of ``folder``'s filesystem but ``free_bytes`` with a file (really reserved)."""
    fs = os.statvfs(folder)
    filler = folder / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.posix_fallocate(fd, 0, fs.f_bavail * fs.f_frsize - free_bytes)
    finally:
        os.close(fd)
    return filler


def _value(i: int) -> bytes:
    return bytes([i % 251]) * 60_000  # one 64 KiB page each


@pytest.mark.parametrize(
    ("tmpfs_size", "refused_by"),
    [("32m", "the memory check"), ("512m", "fallocate")],
    ids=["memory-check", "enospc"],
)
def test_regression_a_full_dev_shm_refused_puts_that_eviction_could_serve(
    pool_name, mount_tmpfs, monkeypatch, clock, tmpfs_size, refused_by
):
    """On a full /dev/shm a pool with plenty of evictable entries refused even 2 KB puts
    ("8.0M more needed") until an explicit evict. A put the pool cannot grow for now evicts
    within the pages it already has. On the small tmpfs the memory check refuses to grow;
    on the large one an earlier reading lets the reservation through (``RECHECK_SHARE``)
    and fallocate's ENOSPC refuses it. A refusal holds for ``GROWTH_RETRY_S``."""
    shm = mount_tmpfs(tmpfs_size)
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(shm))
    with kvcache.create(pool_name, "16M", page_size="64K", clock=clock) as pool:
        header = pool._engine.views.header_q
        pool.put("k0", _value(0))  # backs the first granule (8 MiB) of pages
        reserved = header[H.reserved_pages]
        filler = _fill_but(shm, M)
        credit = pool._segment.room._credit_bytes  # white-box: which refusal comes
        assert (credit >= RESERVE_GRANULE_BYTES) == (refused_by == "fallocate"), credit
        for i in range(1, 3 * reserved):
            pool.put(f"k{i}", _value(i))
        pool.put("small", b"s" * 2048)
        assert header[H.reserved_pages] == reserved  # it stopped growing...
        assert pool.stats().evictions > reserved  # ...and evicted instead
        assert pool.get(f"k{3 * reserved - 1}") == _value(3 * reserved - 1)
        assert pool.get("small") == b"s" * 2048 and "k0" not in pool
        assert pool.check() == []
        # Larger than all the pages the pool has: evicting within them cannot help.
        too_big = bytes((reserved + 1) * 64 * 1024)
        with pytest.raises(kvcache.OutOfSharedMemoryError, match="more"):
            pool.put("too-big", too_big)
        assert "too-big" not in pool and pool.check() == []
        filler.unlink()  # room again: the pool grows again, once it asks again
        with pytest.raises(kvcache.OutOfSharedMemoryError):
            pool.put("too-big", too_big)
        clock.advance(GROWTH_RETRY_S)
        pool.put("too-big", too_big)
        assert header[H.reserved_pages] > reserved and pool.get("too-big") == too_big
    kvcache.destroy(pool_name)


def test_a_restore_that_runs_out_of_memory_midway_fails_rather_than_evict(
    make_pool, pool_name, tmp_path, mount_tmpfs, monkeypatch
):
    """Puts evict when the pool cannot grow, but a restore must not drop entries it read
    (its report would count them as restored): it fails and leaves nothing. Its entries
    (21.2M) fit the room it checks first (22M), yet the third 8 MiB granule does not."""
    pool = make_pool("32M", page_size="64K")
    for i in range(20):
        pool.put(f"k{i}", bytes([i]) * M)
    snapshot = kvcache.persist(pool, tmp_path / "pool.kvsnap")
    shm = mount_tmpfs("64m")
    _fill_but(shm, 22 * M)
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(shm))
    with pytest.raises(NotEnoughMemoryError, match=f"pool '{pool_name}-restored' needs 8.0M"):
        kvcache.restore(f"{pool_name}-restored", snapshot)
    assert sorted(os.listdir(shm)) == ["filler"]


def test_only_a_policy_that_keeps_queues_backs_the_ghost_ring(names) -> None:
    """Nothing but ``s3fifo``, ``arc`` and ``prefix`` writes the ghost ring: in a pool of
    another policy it stays a hole in the file and costs no memory."""
    options = {"page_size": "1K", "inline_bytes": 128, "max_entries": 100_000}
    with (
        kvcache.create(names(), "64K", **options) as lru,
        kvcache.create(names(), "64K", policy="arc", **options) as arc,
    ):
        ghost_bytes = lru._engine.views.geometry.ghost_span[1]
        assert ghost_bytes == 3 * 262_144 * 8  # three words per index slot
        held = [os.stat(pool.path).st_blocks * 512 for pool in (lru, arc)]
        assert held[1] - held[0] == ghost_bytes
        for pool in (lru, arc):
            for i in range(1000):
                pool.put(f"k{i}", b"v" * 64)
        assert os.stat(lru.path).st_blocks * 512 == held[0]  # puts reached no hole


TAMPERED_OPEN = """
import sys, kvcache
from kvcache import OutOfSharedMemoryError
try:
    with kvcache.open(sys.argv[1]) as pool:  # an arc pool now, by its header
        for i in range(40_000):  # twice its entries: evictions write ghosts all over the ring
            pool.put(f"k{i}", b"v" * 64)
except OutOfSharedMemoryError as exc:
    print("refused:", exc)
"""


def test_a_policy_word_changed_to_a_queue_policy_is_backed_before_it_is_written(
    names, mount_tmpfs, monkeypatch
) -> None:
    """A pool writer who changes an ``lru`` pool's policy to ``arc`` makes the next opener
    write the ghost ring that the pool's create left unbacked: on a full /dev/shm a store
    there would be a SIGBUS. The open backs the ring first, and refuses if it cannot."""
    shm = mount_tmpfs("16m")
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(shm))
    name = names()
    with kvcache.create(name, "64K", page_size="1K", inline_bytes=64, max_entries=20_000) as pool:
        pool.put("k", b"v")
        path, ghost_bytes = pool.path, pool._engine.views.geometry.ghost_span[1]
    _fill_but(shm, ghost_bytes // 2)
    with open(path, "r+b") as f:
        f.seek(H.policy * 8)
        f.write(b"arc".ljust(16, b"\0"))
    result = subprocess.run(
        [sys.executable, "-c", TAMPERED_OPEN, name], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])  # -7: SIGBUS
    assert result.stdout.startswith("refused:") and f"{shm} is full" in result.stdout
