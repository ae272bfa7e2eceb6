"""``cortex cache``: the real console script, run in subprocesses."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import kvcache
from kvcache.cli import commands, run
from other_user import needs_root, run_as_nobody
from pool_files import set_format_version

CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"
COMMANDS = [
    "create",
    "list",
    "status",
    "entries",
    "health",
    "persist",
    "restore",
    "evict",
    "destroy",
    "access-log",
    "policies",
    "simulate",
    "stats",
    "metrics",
    "completion",
    "man",
    "llama-server",
]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """Snapshots go to a private folder, for this process and the CLI it runs."""
    monkeypatch.setenv("KVCACHE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def names():
    """Unique pool names; every pool they name is destroyed afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(f"cli-{uuid.uuid4().hex[:10]}")
        return made[-1]

    yield make
    for name in made:
        if name in kvcache.list_pools():
            kvcache.destroy(name)


def cortex(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``cortex cache ARGS``; stdin is a pipe (never the terminal pytest may run on)."""
    return subprocess.run(
        [CORTEX, "cache", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        env=os.environ.copy(),
    )


def cortex_json(*args: str) -> dict:
    result = cortex(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def put_from_another_process(name: str, count: int) -> None:
    code = (
        "import kvcache, sys\n"
        f"pool = kvcache.open({name!r})\n"
        f"for i in range({count}):\n"
        "    pool.put(f'prompt-{i}', bytes([i % 256]) * (1000 + i), priority=i % 3)\n"
        "pool.get('prompt-1'); pool.get('missing')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_full_life_cycle_across_processes(names, home):
    name = names()
    created = cortex_json("create", name, "--size", "64M", "--policy", "lfu", "--page-size", "4K")
    assert created["config"]["policy"] == "lfu" and created["config"]["page_size_bytes"] == 4096
    put_from_another_process(name, 30)

    status = cortex_json("status", name)
    assert (status["num_entries"], status["hits"], status["misses"], status["puts"]) == (
        30,
        1,
        1,
        30,
    )
    assert status["policy"] == "lfu" and status["snapshot"] is None
    listed = cortex_json("list")["pools"]
    assert [p["num_entries"] for p in listed if p["name"] == name] == [30]
    entries = cortex_json("entries", name, "--sort", "size", "--limit", "3")
    assert [e["key"] for e in entries["entries"]] == ["prompt-29", "prompt-28", "prompt-27"]
    assert entries["num_entries"] == 30
    assert cortex_json("health", name)["consistent"] is True

    persisted = cortex_json("persist", name)
    assert persisted["num_entries"] == 30 and Path(persisted["path"]) == home / f"{name}.kvsnap"
    assert cortex_json("status", name)["snapshot"]["path"] == persisted["path"]
    assert cortex_json("destroy", name, "--yes")["destroyed"] == name
    assert name not in kvcache.list_pools()

    restored = cortex_json("restore", name)
    assert restored["num_restored"] == 30 and restored["skipped"] == []
    with kvcache.open(name) as pool:
        assert pool.get("prompt-7") == bytes([7]) * 1007
        assert pool.config.policy == "lfu"
    evicted = cortex_json("evict", name, "--percent", "50")
    assert (
        evicted["num_entries"] > 0
        and cortex_json("status", name)["num_entries"] == 30 - evicted["num_entries"]
    )


def test_disk_pool_life_cycle_by_name(names, home, tmp_path):
    """Every command finds a disk pool by its name alone (through the registry)."""
    folder = tmp_path / "disk-pools"
    folder.mkdir()
    if kvcache.segment.tier_of(folder) != "disk":
        pytest.skip(f"{folder} is not on a disk here")
    name = names()
    created = cortex_json("create", name, "--size", "8M", "--tier", "disk", "--path", str(folder))
    assert created["tier"] == "disk" and created["path"] == str(folder / f"kvcache.{name}")
    put_from_another_process(name, 20)
    assert [
        (p["tier"], p["num_entries"]) for p in cortex_json("list")["pools"] if p["name"] == name
    ] == [("disk", 20)]
    row = [line.split() for line in cortex("list").stdout.splitlines() if line.startswith(name)]
    assert row[0][-1] == "disk"
    status = cortex_json("status", name)
    assert (status["tier"], status["path"], status["repairs"]) == ("disk", created["path"], 0)
    assert cortex_json("entries", name)["num_entries"] == 20
    assert cortex_json("health", name)["consistent"] is True
    snapshot = cortex_json("persist", name)["path"]
    assert cortex_json("evict", name, "--percent", "100")["num_entries"] == 20
    restored = cortex_json("restore", name, "--path", snapshot, "--replace")
    assert restored["num_restored"] == 20
    assert cortex_json("status", name)["path"] == created["path"]  # restored where it was
    assert cortex_json("destroy", name, "--yes")["destroyed"] == name
    assert name not in kvcache.list_pools() and os.listdir(folder) == []
    moved = cortex_json(
        "restore", name, "--path", snapshot, "--tier", "disk", "--folder", str(folder)
    )
    assert moved["pool"]["num_entries"] == 20 and cortex_json("status", name)["tier"] == "disk"


def test_list_shows_a_disk_pool_whose_file_is_gone(names, home, tmp_path):
    if kvcache.segment.tier_of(tmp_path) != "disk":
        pytest.skip(f"{tmp_path} is not on a disk here")
    name = names()
    cortex_json("create", name, "--size", "1M", "--tier", "disk", "--path", str(tmp_path))
    (tmp_path / f"kvcache.{name}").unlink()
    listed = [p for p in cortex_json("list")["pools"] if p["name"] == name]
    assert "is gone" in listed[0]["error"]
    assert "missing" in cortex("list").stdout
    assert cortex_json("destroy", name, "--yes")["destroyed"] == name
    assert name not in kvcache.list_pools()


def test_human_output_is_aligned_tables(names, home):
    name = names()
    assert cortex("create", name, "--size", "16M").returncode == 0
    put_from_another_process(name, 5)
    listing = cortex("list")
    assert listing.returncode == 0
    header = listing.stdout.splitlines()[0].split()
    assert header == ["NAME", "SIZE", "USED", "ENTRIES", "HIT-RATE", "POLICY", "TIER"]
    row = next(line for line in listing.stdout.splitlines() if line.startswith(name)).split()
    assert row[1] == "16.0M" and row[3] == "5" and row[5:] == ["lru", "cpu"]
    status = cortex("status", name).stdout
    assert "entries" in status and "5 of 256" in status
    entries = cortex("entries", name).stdout
    assert "prompt-0" in entries and "5 of 5 entries" in entries
    assert "lfu" in cortex("policies").stdout


def test_a_pool_for_prefix_caches_defaults_to_the_prefix_policy(names, home):
    prefixes, other, chosen = names(), names(), names()
    assert cortex("create", prefixes, "--size", "8M", "--prefix-cache").returncode == 0
    assert cortex("create", other, "--size", "8M").returncode == 0
    assert (
        cortex("create", chosen, "--size", "8M", "--prefix-cache", "--policy", "lru").returncode
        == 0
    )
    policies = {name: kvcache.open(name) for name in (prefixes, other, chosen)}
    try:
        assert [pool.config.policy for pool in policies.values()] == ["prefix", "lru", "lru"]
    finally:
        for pool in policies.values():
            pool.close()


def test_python_dash_m_runs_the_same_commands(names, home):
    name = names()
    result = subprocess.run(
        [sys.executable, "-m", "kvcache", "create", name, "--size", "8M", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["created"]["name"] == name
    assert name in kvcache.list_pools()


def test_create_restore_flag_uses_the_snapshot_when_there_is_one(names, home):
    name = names()
    cortex_json("create", name, "--size", "8M")
    put_from_another_process(name, 4)
    cortex_json("persist", name)
    cortex_json("destroy", name, "--yes")
    doc = cortex_json("create", name, "--size", "8M", "--restore")
    assert doc["restore"]["num_restored"] == 4
    other = names()
    doc = cortex_json("create", other, "--size", "8M", "--restore")
    assert doc["created"]["num_entries"] == 0


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command):
    result = cortex(command, "--help")
    assert result.returncode == 0
    assert "example:" in result.stdout and f"cortex cache {command}" in result.stdout


REPO = Path(__file__).resolve().parent.parent
SIMULATE_TRACE = REPO / "tests" / "data" / "mooncake-head-400.jsonl"
DOCUMENTED_SESSION = [
    "create {name} --size 8M --tier cpu",
    "list",
    "status {name}",
    "entries {name}",
    "health {name}",
    "persist {name}",
    "evict {name} --expired",
    "access-log {name} {log}",
    "access-log {name} --off",
    "stats {name}",
    "status {name} --watch --interval 0.1 --count 1",
    "metrics --pool {name}",
    "destroy {name} --yes",
    "restore {name}",
    "delete {name} --yes",
    "policies",
    "simulate {trace} --capacity 5% --policy lru",
    "completion bash",
    "man",
]
"""One run of every command docs/cli.md's table documents, aliases included."""
NOT_JSON = ("status {name} --watch", "metrics", "completion", "man")
"""Session lines whose output is not one JSON document: lines, Prometheus text, a script
and a manual page."""


def _documented_commands() -> set[str]:
    """The commands (and aliases) in the command-line page's table."""
    section = (REPO / "docs" / "cli.md").read_text().split("\n## ")[0]
    return set(re.findall(r"^\| `([\w-]+)", section, re.MULTILINE)) - {"command"} | set(
        re.findall(r"\(alias `(\w+)`\)", section)
    )


def test_session_covers_every_documented_command_and_alias():
    assert _documented_commands() == {line.split()[0] for line in DOCUMENTED_SESSION}
    assert "delete" in _documented_commands()


def test_bug_every_documented_command_and_alias_runs(names, home):
    """``delete``, documented as destroy's alias, was rejected as an invalid choice."""
    name = names()
    for line in DOCUMENTED_SESSION:
        as_json = not line.startswith(NOT_JSON)
        line = line.format(name=name, trace=SIMULATE_TRACE, log=home / "access.log")
        result = cortex(*line.split(), *(["--json"] if as_json else []))
        assert result.returncode == 0, (line, result.stderr)
        if as_json:
            json.loads(result.stdout)
    assert name not in kvcache.list_pools()  # "delete" removed it


@pytest.mark.parametrize(
    "args",
    [
        [CORTEX, "--version"],
        [CORTEX, "cache", "--version"],
        [sys.executable, "-m", "kvcache", "--version"],
    ],
)
def test_version(args):
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"kvcache {kvcache.__version__}\n",
        "",
    )


def test_create_help_shows_only_what_works():
    """--tier disk|gpu and --path were offered and always failed; gpu is still not there."""
    text = cortex("create", "--help").stdout
    assert "--tier {cpu,disk}" in text and "--path FOLDER" in text
    assert "gpu" not in text


def test_top_level_help_and_unknown_group():
    assert "cache" in subprocess.run([CORTEX, "--help"], capture_output=True, text=True).stdout
    result = subprocess.run([CORTEX, "kache", "list"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown group" in result.stderr


def _run_on_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run the CLI with stdin/stdout on a pseudo-terminal, typing ``answer``."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        args, stdin=follower, stdout=follower, stderr=follower, env=os.environ.copy()
    )
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 30
    answered = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
        if not answered and b"[y/N]" in output:
            os.write(leader, answer.encode() + b"\n")
            answered = True
        if process.poll() is not None and not ready:
            break
    os.close(leader)
    return process.wait(timeout=30), output.decode(errors="replace")


@pytest.mark.parametrize(("answer", "destroyed"), [("n", False), ("", False), ("y", True)])
def test_destroy_asks_on_a_terminal(names, answer, destroyed):
    name = names()
    cortex_json("create", name, "--size", "4M")
    code, output = _run_on_terminal([CORTEX, "cache", "destroy", name], answer)
    assert "destroy pool" in output
    assert (name not in kvcache.list_pools()) == destroyed
    assert code == (0 if destroyed else 1)


def test_bug_destroy_without_a_terminal_destroyed_without_asking(names):
    """A script or pipe cannot answer the question, so it must say --yes."""
    name = names()
    cortex_json("create", name, "--size", "4M")
    for stdin in ("", "y\n"):  # nothing to read, or a "y" a script piped in
        result = cortex("destroy", name, stdin=stdin)
        assert result.returncode == 1 and "--yes" in result.stderr
        assert name in kvcache.list_pools()
    assert cortex("destroy", name, "--yes").returncode == 0
    assert name not in kvcache.list_pools()


def test_destroy_removes_a_pool_this_kvcache_cannot_read(names, home):
    """A pool of an older format (or with a damaged header) cannot be opened, and the
    error says so: destroying it must still work, after asking, from the command line;
    then the upgrade of docs/operations.md restores what was persisted before."""
    older, damaged = names(), names()
    for name in (older, damaged):
        cortex_json("create", name, "--size", "1M", "--inline-bytes", "64")
    with kvcache.open(older) as pool:
        pool.update({"small": b"s" * 10, "large": b"l" * 5000})
    assert cortex("persist", older).returncode == 0
    set_format_version(kvcache.segment.segment_path(older), 11)  # slots, counted by none
    set_format_version(kvcache.segment.segment_path(damaged), 99)
    result = cortex("status", older)
    assert result.returncode == 1 and "format version 11" in result.stderr
    code, output = _run_on_terminal([CORTEX, "cache", "destroy", older], "y")
    assert code == 0 and "unreadable by this kvcache" in output
    result = cortex("destroy", damaged, "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["num_entries"] == 0
    assert older not in kvcache.list_pools() and damaged not in kvcache.list_pools()
    assert not os.path.exists(kvcache.segment.segment_path(older))
    assert cortex("restore", older).returncode == 0
    with kvcache.open(older) as pool:
        assert dict(pool) == {"small": b"s" * 10, "large": b"l" * 5000}


def test_persist_on_a_terminal_draws_progress_and_succeeds(names, home):
    name = names()
    cortex_json("create", name, "--size", "64M")
    with kvcache.open(name) as pool:
        for i in range(40):
            pool.put(f"k{i}", os.urandom(1 << 20))
    code, output = _run_on_terminal([CORTEX, "cache", "persist", name], "")
    assert code == 0 and "persisted" in output
    assert kvcache.inspect_snapshot(home / f"{name}.kvsnap").num_entries == 40


def test_health_repair_mends_a_damaged_pool(names):
    name = names()
    cortex_json("create", name, "--size", "4M")
    put_from_another_process(name, 3)
    with kvcache.open(name) as pool:
        from kvcache.layout import H

        pool._engine.views.header_q[H.num_free_pages] += 5  # white-box damage to a derived counter
    result = cortex("health", name)
    assert result.returncode == 1 and "--repair" in result.stdout
    repaired = cortex("health", name, "--repair")
    assert repaired.returncode == 0 and "repaired" in repaired.stdout
    assert cortex_json("health", name)["consistent"] is True


def test_create_restore_makes_the_pool_its_flags_describe(names, home):
    """``create --restore`` ignored --policy and --ttl (and --page-size, --max-entries,
    --mode, --prealloc): the pool was the snapshot's. The flags describe the pool now,
    whether or not there is a snapshot; the snapshot only fills it."""
    name = names()
    cortex_json("create", name, "--size", "8M", "--policy", "lfu", "--page-size", "4K")
    put_from_another_process(name, 4)
    cortex_json("persist", name)
    cortex_json("destroy", name, "--yes")
    flags = ["--policy", "fifo", "--ttl", "1h", "--page-size", "16K", "--max-entries", "100"]
    doc = cortex_json("create", name, "--size", "16M", *flags, "--mode", "660", "--restore")
    assert doc["restore"]["num_restored"] == 4
    config = cortex_json("status", name)["config"]
    assert (config["policy"], config["default_ttl_s"]) == ("fifo", 3600.0)
    assert (config["page_size_bytes"], config["max_entries"]) == (16384, 100)
    assert config["size_bytes"] == 16 << 20
    assert stat.S_IMODE(kvcache.segment.segment_path(name).stat().st_mode) == 0o660
    with kvcache.open(name) as pool:
        assert pool.get("prompt-3") == bytes([3]) * 1003

    cortex_json("persist", name)
    cortex_json("destroy", name, "--yes")
    cortex_json("create", name, "--size", "16M", "--restore")  # defaults, as without a snapshot
    assert cortex_json("status", name)["config"]["policy"] == "lru"


def test_bug_restore_lost_a_group_shared_pools_mode(names, home):
    name = names()
    cortex_json("create", name, "--size", "4M", "--mode", "660")
    assert cortex_json("persist", name)["mode"] == "660"
    cortex_json("destroy", name, "--yes")
    cortex_json("restore", name)
    path = kvcache.segment.segment_path(name)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    cortex_json("restore", name, "--replace", "--mode", "600")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    cortex_json("restore", name, "--replace", "--mode", "666", "--force")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666


def test_list_leaves_out_a_pool_destroyed_after_listing(names):
    """It was shown as "unreadable" in the POLICY column."""
    kept, gone = names(), names()
    cortex_json("create", kept, "--size", "4M")
    cortex_json("create", gone, "--size", "4M")
    listed = [n for n in kvcache.list_pools() if n in (kept, gone)]
    kvcache.destroy(gone)  # after the listing, before the pool is opened
    described = [commands._describe_pool(name, {}) for name in listed]
    assert [d[0]["name"] for d in described if d is not None] == [kept]
    assert described[listed.index(kept)][1][5] == "lru"


def test_list_still_shows_another_users_pool(names):
    """Opening it fails with PoolNotFoundError too, but it did not go away."""
    name = names()
    cortex_json("create", name, "--size", "4M")
    code, stdout, _ = _run_as_nobody(["list", "--json"])
    assert code == 0
    (mine,) = [p for p in json.loads(stdout)["pools"] if p["name"] == name]
    assert "another user" in mine["error"]


def test_sample_session_example_stores_what_the_readme_shows(names):
    """``examples/store_kv.py``, the README session's other process."""
    name = names()
    cortex_json("create", name, "--size", "64M", "--policy", "lru")
    example = REPO / "examples" / "store_kv.py"
    subprocess.run([sys.executable, str(example), name], check=True, timeout=120)
    status = cortex_json("status", name)
    assert (status["num_entries"], status["hits"], status["misses"]) == (12, 5, 1)
    listed = cortex_json("entries", name, "--sort", "policy", "--limit", "4")["entries"]
    assert [(e["key"], e["priority"], e["last_access"]) for e in listed] == [
        ("prompt-0", 0, 1),
        ("prompt-1", 1, 2),
        ("prompt-2", 2, 3),
        ("prompt-4", 1, 5),
    ]
    assert {e["value_bytes"] for e in listed} == {2 << 20}  # (8, 2, 4, 256, 64) float16


# ---------------------------------------------------------- readers that leave


def _into_pipe_nobody_reads(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``args`` with stdout on a pipe whose reader (a real process) exited unread."""
    read_end, write_end = os.pipe()
    reader = subprocess.Popen(["true"], stdin=read_end)
    os.close(read_end)
    reader.wait(timeout=30)
    try:
        return subprocess.run(args, stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [["cache", "policies"], ["cache", "policies", "--json"], ["cache", "list"], ["--version"]],
)
def test_bug_broken_pipe_ended_in_a_traceback(args):
    result = _into_pipe_nobody_reads([CORTEX, *args])
    assert (result.returncode, result.stderr) == (141, b"")


@pytest.mark.parametrize("args", [["cache", "--help"], ["cache", "--version"], ["--help"]])
def test_help_into_a_pipe_nobody_reads_is_quiet(args):
    """argparse's own --help and --version ignore write errors (exit 0); either way, quiet."""
    result = _into_pipe_nobody_reads([CORTEX, *args])
    assert result.returncode in (0, 141) and result.stderr == b""


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_piped_into_head_stops_quietly(names, as_json):
    """``| head -1`` closes the pipe after one line while most of the output is unwritten."""
    name = names()
    with kvcache.create(name, "16M", page_size="1K") as pool:
        for i in range(3000):  # ~200 bytes of JSON each: far more than a pipe holds
            pool.put(f"prompt-{i:05d}", b"v")
    args = [CORTEX, "cache", "entries", name, "--limit", "0"] + (["--json"] if as_json else [])
    writer = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.run(["head", "-1"], stdin=writer.stdout, capture_output=True, timeout=60)
    writer.stdout.close()
    assert writer.wait(timeout=60) == 141
    assert writer.stderr.read() == b""
    first = head.stdout.decode()
    assert first.count("\n") == 1 and first.startswith("{" if as_json else "KEY")


def test_a_pool_folder_on_a_disk_is_tier_disk(tmp_path, monkeypatch):
    """Regression: create, list and status said "tier cpu" for a pool that
    ``$KVCACHE_SHM_DIR`` put on a disk."""
    if kvcache.memory.is_ram_backed(tmp_path):
        pytest.skip(f"{tmp_path} is in RAM here: no disk folder to test with")
    monkeypatch.setenv("KVCACHE_SHM_DIR", str(tmp_path))
    name = f"cli-{uuid.uuid4().hex[:10]}"
    try:
        created = cortex("create", name, "--size", "1M")
        assert created.stdout.strip().endswith("tier disk"), created.stdout
        assert cortex_json("list")["pools"][0]["tier"] == "disk"
        assert cortex("list").stdout.splitlines()[1].split()[-1] == "disk"
        assert cortex_json("status", name)["tier"] == "disk"
        assert ("tier", "disk") in [
            tuple(r.split()) for r in cortex("status", name).stdout.splitlines()
        ]
    finally:
        kvcache.destroy(name)
    monkeypatch.delenv("KVCACHE_SHM_DIR")
    name = f"cli-{uuid.uuid4().hex[:10]}"
    try:
        assert cortex_json("create", name, "--size", "1M")["tier"] == "cpu"  # /dev/shm
    finally:
        kvcache.destroy(name)


# ------------------------------------------------- persist onto what is not a file


def _private_mounts_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


needs_private_mounts = pytest.mark.skipif(
    not _private_mounts_available(), reason="needs root and unshare --mount; CI runs as root"
)


def _persist_in_private_mounts(
    name: str, tmp_path: Path, setup: str, target: str
) -> tuple[str, str, list[str]]:
    """Persist pool ``name`` onto ``target`` in a mount namespace of its own, after
    ``setup`` made the node there; it must fail. Returns the error, the node's type
    and device numbers after it, and what its folder then holds. The namespace's
    mounts (and the nodes in them) vanish with it: the host is never touched."""
    script = f"""
        mount -t tmpfs tmpfs "$D"
        mkdir "$D/shm"
        mount --bind "$SHM" "$D/shm"
        {setup}
        set +e
        KVCACHE_SHM_DIR="$D/shm" "$CORTEX" cache persist {name} --path {target}
        echo "rc=$?"
        stat -c '%F %t:%T' {target}
        ls -A "$(dirname {target})"
    """
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-euc", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "D": str(tmp_path),
            "SHM": str(kvcache.segment.shm_dir()),
            "CORTEX": CORTEX,
        },
    )
    lines = result.stdout.splitlines()
    assert lines and lines[0] == "rc=1", (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip(), lines[1], lines[2:]


@needs_private_mounts
@pytest.mark.parametrize(
    ("spec", "kind", "shown"),
    [("c 1 3", "character device", "character special file 1:3"),
     ("b 7 0", "block device", "block special file 7:0")],
    ids=["char", "block"],
)  # fmt: skip
def test_bug_persist_replaced_a_device_node_with_a_file(names, tmp_path, spec, kind, shown):
    """It exited 0 and left a 0600 regular file where the node was."""
    name = names()
    cortex_json("create", name, "--size", "1M")
    error, node, listing = _persist_in_private_mounts(
        name, tmp_path, f'mknod "$D/node" {spec}', '"$D/node"'
    )
    assert kind in error and "--path" in error
    assert (node, listing) == (shown, ["node", "shm"])  # and no temporary file


@needs_private_mounts
def test_bug_persist_to_dev_null_as_root_replaced_it(names, tmp_path):
    """``persist --path /dev/null`` as root renamed a snapshot over /dev/null. Tested
    on a /dev of the namespace's own (a tmpfs with a real null device), so a
    regression cannot break the host's."""
    name = names()
    cortex_json("create", name, "--size", "1M")
    setup = "mount -t tmpfs tmpfs /dev; mknod -m 666 /dev/null c 1 3"
    error, node, listing = _persist_in_private_mounts(name, tmp_path, setup, "/dev/null")
    assert "/dev/null is a character device" in error
    assert (node, listing) == ("character special file 1:3", ["null"])


@pytest.mark.parametrize("kind", ["FIFO", "socket"])
def test_bug_persist_replaced_a_fifo_or_socket_with_a_file(names, tmp_path, kind):
    """It exited 0 and the reader of the pipe (or the socket's server) lost its node."""
    name = names()
    cortex_json("create", name, "--size", "1M")
    target = tmp_path / "node"
    if kind == "FIFO":
        os.mkfifo(target)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
    result = cortex("persist", name, "--path", str(target))
    assert result.returncode == 1 and f"is a {kind}" in result.stderr, result.stderr
    is_kind = stat.S_ISFIFO if kind == "FIFO" else stat.S_ISSOCK
    assert is_kind(target.lstat().st_mode)
    assert os.listdir(tmp_path) == ["node"]


def test_persist_onto_a_symlink_replaces_the_link_not_its_target(names, tmp_path):
    name = names()
    cortex_json("create", name, "--size", "1M")
    target, link = tmp_path / "target", tmp_path / "link.kvsnap"
    target.write_bytes(b"keep me")
    link.symlink_to(target)
    cortex_json("persist", name, "--path", str(link))
    assert not link.is_symlink() and kvcache.inspect_snapshot(link).name == name
    assert target.read_bytes() == b"keep me"


def test_bug_create_restore_from_a_named_missing_snapshot_made_an_empty_pool(names, home):
    """An explicit ``--snapshot`` that does not exist is an error; a missing default
    snapshot still means "start empty"."""
    name = names()
    result = cortex("create", name, "--size", "1M", "--restore", "--snapshot", "missing.kvsnap")
    assert result.returncode == 1 and "no snapshot at missing.kvsnap" in result.stderr
    assert name not in kvcache.list_pools()
    doc = cortex_json("create", name, "--size", "1M", "--restore")
    assert doc["created"]["num_entries"] == 0


# ------------------------------------------------------------------ bad input


_HOLD_OPEN = "import sys, kvcache; p = kvcache.open(sys.argv[1]); print('ready', flush=True); "
_HOLD_OPEN += "sys.stdin.read()"
"""A process that keeps pool ``argv[1]`` open until its stdin ends."""


def _foreign_pool_and_snapshot(folder: Path) -> tuple[str, Path] | tuple[None, None]:
    """A pool and a snapshot made by user ``nobody`` (as root only, else nothing)."""
    if os.geteuid() != 0:
        return None, None
    name, snapshot = f"cli-{uuid.uuid4().hex[:10]}", folder / "theirs.kvsnap"
    os.chown(folder, 65534, 65534)

    def make() -> int:
        with kvcache.create(name, "1M", mode=0o666, force=True) as pool:
            pool.put("planted", b"v")
            kvcache.persist(pool, snapshot)
        return 0

    assert run_as_nobody(make)[0] == 0
    return name, snapshot


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """An existing pool with data that another process has open, a good and a broken
    snapshot, names that exist nowhere, and (as root) a pool and snapshot of user nobody.

    Shared by the whole bad-input battery: each case checks that it changed nothing.
    """
    tmp_path = tmp_path_factory.mktemp("world")
    pool_name, missing, junk = (f"cli-{uuid.uuid4().hex[:10]}" for _ in range(3))
    shared = Path(tempfile.mkdtemp(prefix="kvcache-world-"))  # nobody cannot reach tmp_path
    foreign, foreign_snapshot = _foreign_pool_and_snapshot(shared)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KVCACHE_HOME", str(tmp_path / "home"))
        cortex_json("create", pool_name, "--size", "8M")
        put_from_another_process(pool_name, 10)
        good = tmp_path / "good.kvsnap"
        cortex_json("persist", pool_name, "--path", str(good))
        truncated = tmp_path / "truncated.kvsnap"
        truncated.write_bytes(good.read_bytes()[:700])
        garbage = tmp_path / "garbage.kvsnap"
        garbage.write_bytes(os.urandom(4096))
        (Path("/dev/shm") / f"kvcache.{junk}").write_bytes(os.urandom(8192))
        fifo = tmp_path / "fifo.kvsnap"
        os.mkfifo(fifo)
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_OPEN, pool_name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        yield {
            "pool": pool_name,
            "missing": missing,
            "good": str(good),
            "truncated": str(truncated),
            "garbage": str(garbage),
            "fifo": str(fifo),
            "junk": junk,
            "long": "x" * 101,
            "tmp": str(tmp_path),
            "foreign": foreign,
            "foreign_snap": str(foreign_snapshot),
        }
        holder.communicate(timeout=30)  # its stdin ends: it closes the pool and exits
    for name in (pool_name, missing, junk):
        if name in kvcache.list_pools():
            kvcache.destroy(name)
    if foreign is not None:
        kvcache.destroy(foreign, trust_owner="nobody")
    shutil.rmtree(shared)


BAD_INPUTS = [
    ("create {missing} --size 0", "positive"),
    ("create {missing} --size -1G", "negative"),
    ("create {missing} --size abc", "size"),
    ("create {missing} --size ''", "size"),
    ("create {missing} --size 2P", "absurd"),
    ("create {missing} --size 1X", "unit"),
    ("create {missing}", "--size"),
    ("create ../etc --size 1M", "name"),
    ("create a/b --size 1M", "name"),
    ("create .hidden --size 1M", "name"),
    ("create {long} --size 1M", "name"),
    ("create {pool} --size 1M", "already exists"),
    ("create {missing} --size 1M --policy random", "policy"),
    ("create {missing} --size 1M --page-size 3K", "power of two"),
    ("create {missing} --size 1M --page-size 512", "power of two"),
    ("create {missing} --size 1K --page-size 4K", "smaller than one page"),
    ("create {missing} --size 1M --max-entries -5", "negative"),
    ("create {missing} --size 1M --max-entries lots", "whole number"),
    ("create {missing} --size 1M --max-entries 0", "at least 1"),
    ("create {missing} --size 1M --ttl forever", "ttl"),
    ("create {missing} --size 1M --ttl -1s", "ttl"),
    ("create {missing} --size 1M --tier disk --path {tmp}/nope", "does not exist"),
    ("create {missing} --size 1M --tier disk --path {good}", "is not a folder"),
    ("create {missing} --size 1M --tier disk --path /dev/shm", "is in RAM"),
    ("create {missing} --size 1M --tier gpu", "invalid choice"),
    ("create {missing} --size 1M --tier tape", "invalid choice"),
    ("create {missing} --size 1M --mode 999", "octal"),
    ("create {missing} --size 1M --mode 777", "execute"),
    ("create {missing} --size 1M --mode 777 --force", "execute"),
    ("create {missing} --size 1M --mode 755", "execute"),
    ("create {missing} --size 1M --mode 666", "--force"),
    ("create {missing} --size 1M --mode 644", "--force"),
    ("create {missing} --size 1M --mode 60", "owner read and write"),
    ("create {missing} --size 1M --mode 1777", "permission bits"),
    ("create {missing} --size 1M --path {good}", "is not a folder"),
    ("create {missing} --size 16Xi", "unit"),
    ("create {pool} --size 1M --restore --snapshot {good}", "already exists: open it"),
    ("create {missing} --size 1M --restore --snapshot {good} --mode 666", "--force"),
    ("create {missing} --size 1M --restore --snapshot {good} --policy random", "policy"),
    ("create {missing} --size 1M --restore --snapshot {good} --max-entries 0", "at least 1"),
    ("create {missing} --size 900T", "/dev/shm"),
    ("create {missing} --size 1M --restore --snapshot {tmp}/missing.kvsnap", "no snapshot at"),
    ("create {missing} --size 1M --snapshot {good}", "add --restore"),
    ("status {missing}", "no pool named"),
    ("status {junk}", "not a kvcache pool"),
    ("entries {missing}", "no pool named"),
    ("entries {pool} --sort weird", "invalid choice"),
    ("entries {pool} --limit -1", "negative"),
    ("health {missing}", "no pool named"),
    ("persist {missing}", "no pool named"),
    ("persist {pool} --path /proc/kvcache/x.kvsnap", "cannot create folder"),
    ("persist {pool} --path {fifo}", "is a FIFO"),
    ("persist {pool} --path {tmp}", "is a folder"),
    ("restore {missing}", "persist"),
    ("restore {missing} --path /nonexistent/x.kvsnap", "no snapshot"),
    ("restore {missing} --path {garbage}", "not a kvcache snapshot"),
    ("restore {missing} --path {truncated}", "truncated"),
    ("restore {missing} --path {tmp}", "snapshot"),
    ("restore {pool} --path {good}", "pass --replace"),
    ("restore {missing} --path {good} --mode 777", "execute"),
    ("restore {missing} --path {good} --mode 666", "--force"),
    ("restore {missing} --path {good} --mode abc", "octal"),
    ("restore {missing} --path {good} --size 0", "positive"),
    ("restore ../x --path {good}", "name"),
    ("restore {missing} --path {good} --tier disk --folder {tmp}/nope", "does not exist"),
    ("restore {missing} --path {good} --tier tape", "invalid choice"),
    ("evict {pool} --percent 0", "percent"),
    ("evict {pool} --percent 101", "percent"),
    ("evict {pool} --percent -3", "percent"),
    ("evict {pool} --percent abc", "invalid float"),
    ("evict {pool} --bytes lots", "bytes"),
    ("evict {pool}", "required"),
    ("evict {pool} --percent 10 --bytes 1M", "not allowed"),
    ("evict {missing} --percent 10", "no pool named"),
    ("destroy {missing} --yes", "no pool named"),
    ("destroy {pool}", "--yes"),
    ("delete {pool}", "--yes"),
    ("destroy {pool} --yes", "is open in 1 other process"),
    ("delete {pool} --yes", "--force"),
    ("restore {pool} --path {good} --replace", "is open in 1 other process"),
    ("status {foreign}", "belongs to user nobody"),
    ("status {foreign} --trust-owner root", "--trust-owner nobody"),
    ("status {pool} --trust-owner no-such-user", "no user named"),
    ("entries {foreign}", "--trust-owner nobody"),
    ("health {foreign} --repair", "--trust-owner nobody"),
    ("evict {foreign} --percent 50", "--trust-owner nobody"),
    ("persist {foreign} --path {tmp}/theirs.kvsnap", "--trust-owner nobody"),
    ("destroy {foreign} --yes", "--trust-owner nobody"),
    ("restore {missing} --path {foreign_snap}", "belongs to user nobody"),
    ("restore {pool} --path {foreign_snap} --replace --force", "belongs to user nobody"),
    ("create {missing} --size 1M --restore --snapshot {foreign_snap}", "belongs to user nobody"),
    ("delete {missing} --yes", "no pool named"),
    ("destroy ../x --yes", "name"),
    ("bogus", "invalid choice"),
    ("", "required"),
]
USAGE_ERRORS = {
    "create {missing}",
    "create {missing} --size 1M --max-entries -5",
    "create {missing} --size 1M --max-entries lots",
    "create {missing} --size 1M --max-entries 0",
    "create {missing} --size 1M --tier gpu",
    "create {missing} --size 1M --tier tape",
    "create {missing} --size 1M --restore --snapshot {good} --max-entries 0",
    "entries {pool} --sort weird",
    "entries {pool} --limit -1",
    "restore {missing} --path {good} --tier tape",
    "evict {pool} --percent abc",
    "evict {pool}",
    "evict {pool} --percent 10 --bytes 1M",
    "bogus",
    "",
}
"""The bad inputs that do not parse: exit code 2 (every other one is kvcache's refusal: 1)."""


def _snapshot_of_world(world: dict) -> tuple:
    with kvcache.open(world["pool"]) as pool:
        contents = {key: pool.get(key) for key in pool}
        stats = pool.stats()
    ours = {world["pool"], world["missing"], world["junk"], world["foreign"]}
    foreign = world["foreign"] and kvcache.segment.segment_path(world["foreign"]).stat()
    return (
        sorted(ours & set(kvcache.list_pools())),  # other tests may run beside this one
        foreign and (foreign.st_ino, foreign.st_mtime_ns, foreign.st_uid),
        contents,
        (stats.num_entries, stats.used_bytes, stats.evictions),
        Path(world["good"]).read_bytes(),
        sorted(os.listdir(world["tmp"])),
    )


@pytest.mark.parametrize(
    ("command", "expected"), BAD_INPUTS, ids=[c or "(nothing)" for c, _ in BAD_INPUTS]
)
def test_bad_input_is_one_line_exit_1_or_2_and_changes_nothing(world, home, command, expected):
    if "{foreign" in command and world["foreign"] is None:
        pytest.skip("another user's pool needs root to make; CI runs as root")
    before = _snapshot_of_world(world)
    args = [a.format(**world) for a in shlex.split(command)]
    result = cortex(*args)
    code = 2 if command in USAGE_ERRORS else 1
    assert result.returncode == code, (result.stdout, result.stderr)
    message = result.stderr.strip()
    assert "Traceback" not in result.stderr and "\n" not in message, result.stderr
    assert expected.lower() in message.lower(), message
    assert result.stdout == ""
    assert _snapshot_of_world(world) == before


def test_bad_input_battery_is_large_enough():
    assert len(BAD_INPUTS) >= 40
    assert USAGE_ERRORS.issubset(command for command, _ in BAD_INPUTS)


def _run_as_nobody(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI entry point as user ``nobody``: (exit code, stdout, stderr)."""
    return run_as_nobody(lambda: run(argv))


@needs_root
def test_bug_commands_used_another_users_pool_and_snapshot(names, tmp_path):
    """User nobody's pool (mode 666) and snapshot: refused with how to trust them,
    listed with whose they are, and usable with ``--trust-owner``."""
    shared = Path(tempfile.mkdtemp(prefix="kvcache-cli-"))
    theirs, snapshot = _foreign_pool_and_snapshot(shared)
    assert theirs is not None and snapshot is not None
    try:
        refused = cortex("status", theirs)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert "belongs to user nobody" in refused.stderr
        assert "--trust-owner nobody" in refused.stderr
        assert cortex_json("status", theirs, "--trust-owner", "nobody")["num_entries"] == 1

        (listed,) = [p for p in cortex_json("list")["pools"] if p["name"] == theirs]
        assert listed["owner"] == "nobody" and "--trust-owner nobody" in listed["error"]
        table = cortex("list").stdout.splitlines()
        (row,) = [line for line in table if line.startswith(theirs)]
        assert row.split()[5] == "untrusted"
        assert any(line.startswith(f"- pool '{theirs}' belongs to user nobody") for line in table)
        trusted = cortex_json("list", "--trust-owner", "nobody")["pools"]
        assert [p["num_entries"] for p in trusted if p["name"] == theirs] == [1]

        mine = names()
        refused = cortex("restore", mine, "--path", str(snapshot))
        assert refused.returncode == 1 and "belongs to user nobody" in refused.stderr
        assert mine not in kvcache.list_pools()
        args = ("--path", str(snapshot), "--mode", "600", "--trust-owner", "nobody")
        assert cortex_json("restore", mine, *args)["num_restored"] == 1

        cortex_json("destroy", theirs, "--yes", "--trust-owner", "nobody")
        assert theirs not in kvcache.list_pools()
    finally:
        kvcache.segment.segment_path(theirs).unlink(missing_ok=True)
        shutil.rmtree(shared)


def test_another_users_pool_is_a_clear_error(names):
    """Pools are 0600: a different (real) user cannot open one, and is told why."""
    name = names()
    cortex_json("create", name, "--size", "4M")
    code, _, stderr = _run_as_nobody(["status", name])
    assert code == 1, stderr
    assert "another user" in stderr and "Traceback" not in stderr
    assert stderr.count("\n") == 1


def _under_address_space_limit(limit: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``cortex cache ARGS`` run by ``prlimit --as`` (ulimit -v): a real limit, e.g. "1G"."""
    return subprocess.run(
        ["prlimit", f"--as={kvcache.parse_size(limit)}", CORTEX, "cache", *args],  # bytes only
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    message = result.stderr.strip()
    assert "Traceback" not in result.stderr and "\n" not in message, result.stderr
    return message


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_regression_an_address_space_limit_ended_in_an_oserror_traceback(names):
    """mmap of a 4 GiB pool fails with ENOMEM under a 1 GiB ``ulimit -v``; the CLI printed
    the raw OSError. Now it says which limit, and a failed create leaves no file."""
    name = names()
    message = _one_line_error(_under_address_space_limit("1G", "create", name, "--size", "4G"))
    assert f"pool '{name}' needs 4.0G of address space" in message, message
    assert "may map at most 1.0G in all" in message and "ulimit -v" in message, message
    assert "nothing was created" in message, message
    assert [f for f in os.listdir(kvcache.segment.shm_dir()) if name in f] == []

    cortex_json("create", name, "--size", "4G")
    message = _one_line_error(_under_address_space_limit("1G", "status", name))
    assert "may map at most 1.0G in all" in message and "nothing was" not in message, message
    listed = _under_address_space_limit("1G", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [p for p in json.loads(listed.stdout)["pools"] if p["name"] == name]
    assert "address space" in row["error"]
    assert _under_address_space_limit("8G", "status", name).returncode == 0


def test_a_key_that_looks_like_markup_is_shown_as_it_is(names) -> None:
    """rich read table cells as markup and emoji codes: "[red]" was shown as nothing and
    "a[bold]b:smile:" as "ab" and an emoji."""
    name = names()
    with kvcache.create(name, "1M", page_size="4K") as pool:
        pool.put("[red]", b"x")
        pool.put("a[bold]b:smile:[/]", b"x")
    listed = cortex("entries", name)
    assert listed.returncode == 0, listed.stderr
    assert "[red]" in listed.stdout and "a[bold]b:smile:[/]" in listed.stdout
