"""``cortex cache simulate``: the real console script on a real trace, and its errors."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcache.simulate import MAX_LINE_BYTES, MAX_NESTING, execute, read_trace, runs_for
from test_cli import CORTEX, cortex, cortex_json

TRACE = Path(__file__).resolve().parent / "data" / "mooncake-head-400.jsonl"


def test_json_has_opt_and_each_policy_per_capacity_as_the_library_computes():
    doc = cortex_json("simulate", str(TRACE), "--capacity", "2%,10%", "--policy", "lru,fifo")
    trace = read_trace(TRACE)
    assert doc["trace"]["requests"] == 400 and doc["trace"]["distinct_blocks"] == trace.num_distinct
    results = doc["results"]
    expected = execute(
        trace, runs_for(["lru", "fifo"], [o["capacity_blocks"] for o in results[::3]]), jobs=1
    )
    assert [(r["policy"], r["capacity_blocks"], r["block_hits"]) for r in results] == [
        (o.policy, o.capacity_blocks, o.block_hits) for o in expected
    ]
    for first in range(0, len(results), 3):
        opt, *others = results[first : first + 3]
        assert opt["policy"] == "opt" and all(o["block_hits"] <= opt["block_hits"] for o in others)
        assert opt["saved_seconds"] == pytest.approx(opt["hit_tokens"] / 5000)


def test_the_table_names_capacities_policies_and_the_prefill_rate():
    result = cortex(
        "simulate", str(TRACE), "--capacity", "5%", "--policy", "lru", "--prefill-rate", "2000"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "400 requests" in lines[0]
    assert lines[1].split()[:4] == ["CAPACITY", "POLICY", "BLOCK", "HITS"]
    assert " opt " in lines[2] and " lru " in lines[3] and "2,000 tokens/s" in result.stdout


def test_sizes_are_counted_in_blocks_of_the_models_kv():
    doc = cortex_json(
        "simulate", str(TRACE), "--size", "1G,4G", "--kv-bytes-per-token", "128K", "--policy", "lru"
    )
    assert doc["block_bytes"] == 512 * 128 * 1024
    assert sorted({r["capacity_blocks"] for r in doc["results"]}) == [16, 64]


def test_first_requests_only():
    doc = cortex_json(
        "simulate", str(TRACE), "--requests", "50", "--capacity", "100", "--policy", "lru"
    )
    assert doc["trace"]["requests"] == 50


def test_plot_draws_a_png(tmp_path):
    plot = tmp_path / "hits.png"
    result = cortex(
        "simulate", str(TRACE), "--capacity", "1%,5%", "--policy", "lru", "--plot", str(plot)
    )
    assert result.returncode == 0, result.stderr
    assert (
        plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot written to {plot}" in result.stdout
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["{missing}"], "cannot read trace"),
        (["{garbage}"], "line 2: not JSON"),
        (["{trace}", "--capacity", "0%"], "bad capacity '0%'"),
        (["{trace}", "--capacity", "lots"], "bad capacity 'lots'"),
        (["{trace}", "--size", "10M"], "holds no"),
        (["{trace}", "--size", "ten"], "simulated pool size"),
        (["{trace}", "--policy", "belady"], "unknown eviction policy 'belady'"),
        (["{trace}", "--plot", "{tmp}/hits.xyz"], "name a file ending in one of"),
        (["{trace}", "--plot", "{tmp}/no/such/hits.png"], "its folder does not exist"),
        (["{trace}", "--capacity", "1%", "--size", "1G"], "not allowed with argument"),
        (["{trace}", "--jobs", "0"], "must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tmp_path, args, says):
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"hash_ids": [1]}\nnot json\n')
    paths = {
        "missing": tmp_path / "missing.jsonl",
        "garbage": garbage,
        "trace": TRACE,
        "tmp": tmp_path,
    }
    result = cortex("simulate", *(a.format(**paths) for a in args))
    does_not_parse = says in ("not allowed with argument", "must be at least 1")  # exit 2
    assert result.returncode == (2 if does_not_parse else 1) and result.stdout == ""
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.xyz"))


def test_json_output_is_one_document():
    result = cortex("simulate", str(TRACE), "--capacity", "100", "--policy", "lru", "--json")
    assert json.loads(result.stdout)["results"][1]["policy"] == "lru"


# ------------------------------------------------------------ traces from elsewhere


def _one_line_error(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_bug_a_fifo_as_the_trace_never_returned(tmp_path):
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)  # nobody ever writes to it: reading would wait forever
    _one_line_error(cortex("simulate", str(fifo)), f"{fifo} is not a regular file")


def test_bug_dev_zero_as_the_trace_grew_until_memory_ran_out():
    _one_line_error(cortex("simulate", "/dev/zero"), "/dev/zero is not a regular file")


def test_a_folder_is_not_a_trace(tmp_path):
    _one_line_error(cortex("simulate", str(tmp_path)), "is not a regular file")


def test_dash_reads_the_trace_from_stdin():
    result = cortex(
        "simulate", "-", "--capacity", "100", "--policy", "lru", "--json", stdin=TRACE.read_text()
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trace"]["requests"] == 400


def test_bug_deep_nesting_ended_in_a_recursion_error_traceback(tmp_path):
    nested = tmp_path / "nested.jsonl"
    nested.write_text('{"hash_ids": [1]}\n' + "[" * 100_000 + "\n")
    _one_line_error(cortex("simulate", str(nested)), f"{nested} line 2: nested more than")


def test_nesting_is_bounded_by_structure_not_by_brackets_in_strings(tmp_path):
    trace = tmp_path / "t.jsonl"
    deep = "[" * MAX_NESTING + "]" * MAX_NESTING  # one level too deep inside the object
    trace.write_text(json.dumps({"hash_ids": [1], "note": "[[[" * 100}) + "\n")
    assert read_trace(trace).num_requests == 1
    trace.write_text('{"hash_ids": [1], "deep": ' + deep + "}\n")
    _one_line_error(cortex("simulate", str(trace)), "line 1: nested more than")


def test_bug_a_64_mib_line_was_parsed_for_minutes(tmp_path):
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as out:
        out.write(b'{"hash_ids": [1]}\n{"hash_ids": [')
        out.write(b"1," * (32 << 20))
        out.write(b"1]}\n")
    _one_line_error(cortex("simulate", str(huge)), f"{huge} line 2 is longer than")


def test_a_line_just_under_the_limit_is_read(tmp_path):
    trace = tmp_path / "t.jsonl"
    head, tail = '{"hash_ids": [1, 2], "pad": "', '"}\n'
    trace.write_text(head + "x" * (MAX_LINE_BYTES - len(head) - len(tail)) + tail)
    assert read_trace(trace).num_reads == 2


# ------------------------------------------------------------ stopping a simulation

RUN_ON_TWO_WORKERS = ("--capacity", "100", "--policy", "lru,fifo", "--jobs", "2")
SCRATCH = ".kvcache.simulate."
"""The hidden name of a replay's scratch pool (``kvcache.segment``'s builds)."""


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace whose pool replays at 100 blocks take minutes (800,000 block reads nearly
    all missed), so the workers are replaying whenever a test stops the simulation."""
    path = tmp_path_factory.mktemp("traces") / "long.jsonl"
    rng = np.random.default_rng(0)
    with path.open("w") as out:
        for _ in range(20_000):
            out.write(json.dumps({"hash_ids": rng.integers(0, 10**6, 40).tolist()}) + "\n")
    return path


@pytest.fixture
def pool_folder() -> Iterator[Path]:
    """A private ``$KVCACHE_SHM_DIR`` in /dev/shm, so the scratch pools are easy to count."""
    folder = Path(tempfile.mkdtemp(prefix="kvcache-simulate-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder)


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (state first, then the parent's pid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def _children(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _stat_fields(int(entry.name))[1:2] == [str(pid)]
    ]


def _maps_scratch(pid: int) -> bool:
    try:
        return SCRATCH in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _wait_for_replays(simulation: subprocess.Popen[str], folder: Path, workers: list[int]) -> None:
    """Wait until the simulation's two workers (listed in ``workers`` as they are seen,
    for the caller to kill should this fail) both replay in a scratch pool that has no
    name in ``folder`` (what a kill leaves named there stays there)."""

    def replaying() -> bool:
        assert simulation.poll() is None, simulation.communicate()
        workers[:] = sorted(set(workers) | set(_children(simulation.pid)))
        return (
            len(workers) == 2
            and all(_maps_scratch(pid) for pid in workers)
            and not any(name.startswith(SCRATCH) for name in os.listdir(folder))
        )

    _until(replaying, "two workers replaying in scratch pools with no name in the folder")


@contextlib.contextmanager
def _replaying(
    trace: Path, folder: Path, **popen: Any
) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A simulation of ``trace`` on two workers, once both replay; it and its workers are
    killed afterwards if still alive (on a build whose workers outlive it)."""
    simulation = subprocess.Popen(
        [CORTEX, "cache", "simulate", str(trace), *RUN_ON_TWO_WORKERS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KVCACHE_SHM_DIR": str(folder)},
        **popen,
    )
    workers: list[int] = []
    try:
        _wait_for_replays(simulation, folder, workers)
        yield simulation, workers
    finally:
        for pid in [simulation.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        simulation.wait()


def _errors(simulation: subprocess.Popen[str]) -> str:
    assert simulation.stderr is not None
    return simulation.stderr.read()


@pytest.mark.parametrize(
    ("signum", "status", "says"),
    [
        (signal.SIGTERM, 143, "stopped by SIGTERM"),
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGKILL, -signal.SIGKILL, ""),
    ],
)
def test_bug_workers_outlived_a_stopped_simulation(long_trace, pool_folder, signum, status, says):
    # started with SIGINT ignored, as `simulate ... &` in a script is: it still stops on it
    ignoring_sigint = {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    with _replaying(long_trace, pool_folder, **ignoring_sigint) as (simulation, workers):
        simulation.send_signal(signum)
        assert simulation.wait(timeout=30) == status
        _until(lambda: not any(_alive(pid) for pid in workers), "the workers died", 10)
        assert os.listdir(pool_folder) == []
        errors = _errors(simulation)
        assert "Traceback" not in errors and errors.strip().endswith(says)
        assert len(errors.strip().splitlines()) == (1 if says else 0), errors


def test_a_killed_worker_is_one_line_not_a_hang(long_trace, pool_folder):
    with _replaying(long_trace, pool_folder) as (simulation, workers):
        os.kill(workers[0], signal.SIGKILL)  # as the OOM killer would
        assert simulation.wait(timeout=30) == 1
        errors = _errors(simulation)
        assert "a replay worker died" in errors and len(errors.splitlines()) == 1, errors
        _until(lambda: not any(_alive(pid) for pid in workers), "the workers died", 10)
        assert os.listdir(pool_folder) == []
