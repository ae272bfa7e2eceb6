"""The command's names: ``kvcache COMMAND``, ``python -m kvcache COMMAND`` and the first
spelling, ``cortex cache COMMAND``, run the same commands with the same exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import kvcache

BIN = str(Path(sys.executable).parent)
KVCACHE = shutil.which("kvcache", path=BIN) or "kvcache"
CORTEX = shutil.which("cortex", path=BIN) or "cortex"
SPELLINGS = {
    "kvcache": [KVCACHE],
    "kvcache cache": [KVCACHE, "cache"],
    "cortex cache": [CORTEX, "cache"],
    "python -m kvcache": [sys.executable, "-m", "kvcache"],
    "python -m kvcache cache": [sys.executable, "-m", "kvcache", "cache"],
}
VERBS = ["create", "list", "status", "stats", "metrics", "entries", "health", "persist"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=60, env=os.environ.copy(), stdin=None
    )


@pytest.fixture
def name():
    made = f"names-{uuid.uuid4().hex[:10]}"
    yield made
    if made in kvcache.list_pools():
        kvcache.destroy(made, force=True)


def test_kvcache_help_lists_the_verbs_directly():
    result = _run(KVCACHE, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kvcache ")
    assert all(f"\n    {verb} " in result.stdout for verb in VERBS), result.stdout
    assert "example:\n  kvcache create " in result.stdout


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_runs_the_same_commands(spelling, name):
    command = SPELLINGS[spelling]
    created = _run(*command, "create", name, "--size", "8M", "--json")
    assert created.returncode == 0, created.stderr
    with kvcache.open(name) as pool:
        pool.put("prompt", b"kv")
    status = _run(*command, "status", name, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["num_entries"] == 1
    destroyed = _run(*command, "destroy", name, "--yes")
    assert destroyed.returncode == 0, destroyed.stderr
    assert name not in kvcache.list_pools()


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(
    "args", [["bogus"], ["list", "--no-such-option"], ["evict", "x"], []], ids=str
)
def test_a_command_line_that_does_not_parse_exits_2_in_one_line(spelling, args):
    result = _run(*SPELLINGS[spelling], *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and "--help" in result.stderr


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["create", "{name}", "--size", "-5G"], "pool size '-5G' is negative"),
        (["create", "{name}", "--size", "8M", "--ttl", "-1s"], "negative"),
        (["create", "{name}", "--size", "8M", "--page-size", "-4K"], "negative"),
        (["create", "{name}", "--size", "-.5G"], "negative"),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value),
)
def test_a_negative_value_gets_kvcaches_own_message(args, what, name):
    result = _run(KVCACHE, *(arg.format(name=name) for arg in args))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and what in result.stderr, result.stderr
    assert name not in kvcache.list_pools()


def test_cortex_alone_says_how_to_use_it():
    assert _run(CORTEX).returncode == 2
    shown = _run(CORTEX, "--help")
    assert shown.returncode == 0 and "kvcache COMMAND" in shown.stdout
    assert _run(CORTEX, "--version").stdout == f"kvcache {kvcache.__version__}\n"
