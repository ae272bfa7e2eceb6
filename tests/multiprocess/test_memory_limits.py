"""Pools never reserve past a real cgroup's memory limit: a clear error, not the OOM killer.

Each test makes a child cgroup with a memory limit under this process's own
memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``; these tests
run as root) and runs a real ``cortex`` or Python child in it. tmpfs pages a
process reserves are charged to its cgroup and cannot be reclaimed, so before
the memory check such a child was killed by the kernel (exit 137) and left its
hidden file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvcache import segment

M = 1 << 20
CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"

CHILD_FILL = """
import json, sys
import kvcache
from kvcache.layout import H
pool = kvcache.create(sys.argv[1], "1G")  # pages are reserved 8 MiB at a time as used
for i in range(NUM_PUTS):
    pool.put(f"k{i}", bytes([i % 256]) * (1 << 20))
stats = pool.stats()
print(json.dumps({
    "reserved_bytes": int(pool._engine.views.header_q[H.reserved_pages]) * stats.page_size_bytes,
    "evictions": stats.evictions,
    "problems": pool.check(),
    "first": pool.get("k0"),
    "last": pool.get(f"k{NUM_PUTS - 1}") == bytes([(NUM_PUTS - 1) % 256]) * (1 << 20),
}))
""".replace("NUM_PUTS", "512")


def _own_memory_cgroup() -> tuple[str, Path]:
    """This process's memory cgroup: ("v1" or "v2", its folder at the usual mount point)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for _, controllers, path in (line.split(":", 2) for line in lines):
        if "memory" in controllers.split(","):
            return "v1", Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for hierarchy, controllers, path in (line.split(":", 2) for line in lines):
        if hierarchy == "0" and not controllers:
            return "v2", Path("/sys/fs/cgroup") / path.lstrip("/")
    pytest.skip("this process is in no memory cgroup")


@pytest.fixture
def memory_cgroup() -> Iterator[Callable[[int], Path]]:
    """``memory_cgroup(limit_bytes)``: a real cgroup with that limit; its cgroup.procs file."""
    made: list[Path] = []

    def make(limit_bytes: int) -> Path:
        version, parent = _own_memory_cgroup()
        folder = parent / f"kvcache-test-{uuid.uuid4().hex[:8]}"
        limit_file = "memory.limit_in_bytes" if version == "v1" else "memory.max"
        try:
            if version == "v2" and "memory" not in (parent / "cgroup.subtree_control").read_text():
                (parent / "cgroup.subtree_control").write_text("+memory")
            folder.mkdir()
            made.append(folder)
            (folder / limit_file).write_text(str(limit_bytes))
        except OSError as exc:
            pytest.skip(f"cannot make a {version} memory cgroup under {parent}: {exc}")
        return folder / "cgroup.procs"

    yield make
    for folder in made:
        with contextlib.suppress(FileNotFoundError):
            folder.rmdir()  # its children have exited; charges left go to the parent


def _in_cgroup(procs: Path, *command: str) -> list[str]:
    """``command``, run by a shell that first moves itself into the cgroup."""
    return ["sh", "-c", f'echo $$ > {procs} && exec "$0" "$@"', *command]


def _traces(name: str) -> list[str]:
    return [f for f in os.listdir(segment.shm_dir()) if name in f]


def test_prealloc_beyond_the_cgroup_limit_is_refused(memory_cgroup, pool_name) -> None:
    procs = memory_cgroup(256 * M)
    result = subprocess.run(
        _in_cgroup(procs, CORTEX, "cache", "create", pool_name, "--size", "512M", "--prealloc"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, (result.returncode, result.stderr)
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert f"(cgroup {procs.parent} memory." in message, message
    assert " 256M, free " in message, message
    assert _traces(pool_name) == []


def test_a_growing_pool_stops_at_the_cgroup_limit(memory_cgroup, pool_name) -> None:
    """A pool larger than the cgroup allows stops growing once its pages would pass the
    limit, and from then on serves puts by evicting within the pages it has (regression:
    every put failed with NotEnoughMemoryError there). (``pool_name`` is torn
    down first, and destroying the pool frees the pages charged to the cgroup before it
    is removed.)"""
    procs = memory_cgroup(256 * M)
    result = subprocess.run(
        _in_cgroup(procs, sys.executable, "-c", CHILD_FILL, pool_name),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert 64 * M <= report["reserved_bytes"] < 256 * M  # stopped by the limit, not before
    assert report["evictions"] >= 512 - report["reserved_bytes"] // M
    assert report["problems"] == [] and report["first"] is None and report["last"]
