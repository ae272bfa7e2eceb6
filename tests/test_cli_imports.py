"""What each command imports: the deterministic side of how fast it starts.

``benchmarks/bench_startup.py`` measures the time; here we check that ``import kvcache``,
``--version`` and ``list``/``status`` load only what they use (no simulate, metrics,
remote client, asyncio or progress bar), which is what keeps them fast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvcache
from kvcache.cli import COMMANDS
from kvcache.cli.parser import build

SOURCE = Path(kvcache.__file__).resolve().parents[1]

LOADED_BY = """
import json, sys
from kvcache.cli import run
try:
    sys.exit(run(sys.argv[1:]))
finally:  # after the exit status too (--version leaves by SystemExit)
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

NEVER_AT_START = {
    "kvcache.simulate",
    "kvcache.metrics",
    "kvcache.integrations",
    "kvcache.prefix",
    "kvcache.cli.simulating",
    "kvcache.cli.operations",
    "kvcache.cli.llama_server",
    "kvcache.cli.shell",
    "kvcache.cli.bars",
    "asyncio",
    "multiprocessing",
    "concurrent.futures.process",
    "redis",
    "prometheus_client",
    "aiohttp",
    "shtab",
    "rich.progress",
    "rich.live",
}
"""Modules that no reporting command of a local pool has a use for."""


def python(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter importing kvcache from the tree under test."""
    result = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env={**os.environ, "PYTHONPATH": str(SOURCE)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def loaded_by(*argv: str) -> set[str]:
    """The modules a fresh ``kvcache ARGV...`` has imported when it is done."""
    return set(json.loads(python(LOADED_BY, *argv).stderr.splitlines()[-1]))


def unwanted(modules: set[str], names: set[str]) -> set[str]:
    """Those of ``modules`` that are one of ``names`` or inside one."""
    return {m for m in modules if m in names or m.rpartition(".")[0] in names}


def test_importing_kvcache_loads_neither_numpy_nor_the_pool() -> None:
    found = python("import json, sys, kvcache; print(json.dumps(sorted(sys.modules)))").stdout
    modules = set(json.loads(found))
    assert {m for m in modules if m.startswith("kvcache")} == {"kvcache", "kvcache.errors"}
    assert "numpy" not in modules


def test_every_public_name_is_there_on_first_use() -> None:
    code = "import kvcache; print(all(getattr(kvcache, n) for n in kvcache.__all__))"
    assert python(code).stdout.strip() == "True"


def test_a_submodule_is_an_attribute_as_before() -> None:
    assert kvcache.segment.shm_dir() is not None
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        kvcache.no_such_thing  # noqa: B018


def test_version_loads_no_pool_code_and_no_rich() -> None:
    modules = loaded_by("--version")
    assert {m for m in modules if m.startswith("kvcache")} == {
        "kvcache",
        "kvcache.errors",
        "kvcache.cli",
        "kvcache.cli.output",
        "kvcache.cli.parser",
    }
    assert not unwanted(modules, {"numpy", "rich"})


def test_list_and_status_load_only_what_they_use(pool_name: str) -> None:
    kvcache.create(pool_name, "1M", page_size="4K").close()
    for argv in (["list"], ["status"], ["status", pool_name]):
        assert unwanted(loaded_by(*argv), NEVER_AT_START) == set(), argv


def test_a_json_document_is_printed_without_rich(pool_name: str) -> None:
    kvcache.create(pool_name, "1M", page_size="4K").close()
    for argv in (["list", "--json"], ["status", pool_name, "--json"]):
        assert unwanted(loaded_by(*argv), {"rich", *NEVER_AT_START}) == set(), argv


def test_every_command_has_a_function_to_run() -> None:
    assert set(COMMANDS) == set(_commands(build("kvcache")))
    for name, where in COMMANDS.items():
        module, _, function = where.partition(".")
        imported = __import__(f"kvcache.cli.{module}", fromlist=[function])
        assert callable(getattr(imported, function)), name


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[return-value]


def test_a_lazy_parser_parses_and_helps_as_the_whole_one() -> None:
    whole, lazy = build("kvcache"), build("kvcache", lazy=True)
    argv = ["simulate", "trace.jsonl", "--capacity", "1%,5%", "--prefill-rate", "9000"]
    assert lazy.parse_args(argv) == whole.parse_args(argv)
    assert lazy.format_help() == whole.format_help()
    for name in ("create", "entries", "llama-server"):
        assert _commands(lazy)[name].format_help() == _commands(whole)[name].format_help()
