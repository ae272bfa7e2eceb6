"""``--json`` is a contract: every reporting command takes it, every document carries
``"schema"``, and each command's real output validates against its JSON Schema file
(``src/kvcache/schemas/COMMAND.json``), which names every key: an undocumented key fails."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

import kvcache
from json_schemas import check, schema_of
from kvcache.cli.parser import build

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "mooncake-head-400.jsonl"
STORE = """
import sys, numpy as np, kvcache
from kvcache import KVLayout, PrefixCache
with kvcache.open(sys.argv[1]) as pool:
    cache = PrefixCache(pool, "model", KVLayout(2, 1, 4, "float16"), chunk_tokens=4)
    cache.store(list(range(8)), np.ones((2, 2, 1, 8, 4), np.float16))
    cache.retrieve(list(range(12)))
    pool.put("text", b"v" * 100, ttl=100)
    pool.get("text"), pool.get("missing")
"""


def _json(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "kvcache", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, (args, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, dict]]]:
    """(schema name, document) of every reporting command, run on real pools."""
    tmp = tmp_path_factory.mktemp("json")
    a, lower, upper, again = (f"json-{uuid.uuid4().hex[:10]}" for _ in range(4))
    docs: list[tuple[str, dict]] = []
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KVCACHE_HOME", str(tmp / "home"))
        try:
            docs.append(("create", _json("create", a, "--size", "8M", "--prefix-cache")))
            subprocess.run([sys.executable, "-c", STORE, a], check=True, timeout=120)
            docs.append(("create", _json("create", a, "--size", "8M", "--exist-ok")))
            docs.append(("create", _json("create", lower, "--size", "8M")))
            docs.append(("create", _json("create", upper, "--size", "8M", "--spill-to", lower)))
            docs += [("list", _json("list")), ("list", _json("status"))]
            docs += [("status", _json("status", name)) for name in (a, upper)]
            docs += [("stats", _json("stats", a)), ("stats", _json("stats", a, "--reset"))]
            docs += [("entries", _json("entries", a, "--sort", sort)) for sort in ("lru", "policy")]
            docs += [("health", _json("health", a)), ("health", _json("health", a, "--repair"))]
            docs.append(("access-log", _json("access-log", a, str(tmp / "access.log"))))
            docs.append(("status", _json("status", a)))  # with its access log
            docs.append(("access-log", _json("access-log", a, "--off")))
            docs.append(("persist", _json("persist", a)))
            docs.append(("status", _json("status", a)))  # with its snapshot
            docs.append(("evict", _json("evict", a, "--expired")))
            docs.append(("metrics", _json("metrics", "--pool", a)))
            docs.append(("destroy", _json("destroy", a, "--yes")))
            docs.append(("restore", _json("restore", a)))
            snapshot = str(tmp / "home" / f"{a}.kvsnap")
            docs.append(("create", _json("create", again, "--size", "8M", "--restore",
                                         "--snapshot", snapshot)))  # fmt: skip
            docs.append(("evict", _json("evict", a, "--percent", "50")))
            docs.append(("policies", _json("policies")))
            docs.append(("simulate", _json("simulate", str(TRACE), "--capacity", "5%",
                                           "--policy", "lru,prefix")))  # fmt: skip
            yield docs
        finally:
            for name in (upper, lower, a, again):
                if name in kvcache.list_pools():
                    kvcache.destroy(name, force=True)


def test_every_reporting_command_takes_json_and_has_a_schema() -> None:
    parser = build("kvcache")
    commands = next(a for a in parser._actions if a.dest == "command").choices
    reporting = {
        name
        for name, sub in commands.items()
        if any("--json" in action.option_strings for action in sub._actions)
    }
    aliases = {"delete"}
    assert "metrics" in reporting
    for name in reporting - aliases:
        assert schema_of(name)["properties"]["schema"] == {"const": 1}


def test_every_document_validates_against_its_schema(documents) -> None:
    assert {name for name, _ in documents} >= {
        "create", "list", "status", "stats", "entries", "health", "access-log", "persist",
        "evict", "metrics", "destroy", "restore", "policies", "simulate",
    }  # fmt: skip
    for name, document in documents:
        check(name, document)


@pytest.mark.parametrize("where", ["top", "nested"])
def test_an_undocumented_key_fails(documents, where) -> None:
    name, document = next(d for d in documents if d[0] == "status")
    changed = copy.deepcopy(document)
    (changed if where == "top" else changed["config"])["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        check(name, changed)
