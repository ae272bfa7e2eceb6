"""The access log: what prefix caches ask of a pool, bounded, shared by every process,
and replayed by ``cortex cache simulate`` exactly as a Mooncake trace of the same prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import KVLayout, PrefixCache
from kvcache.accesslog import AccessLog, LogSpec, chunk_id
from kvcache.simulate import execute, read_trace, runs_for
from test_cli import cortex, cortex_json

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, dtype="float16")
CHUNK = 4
LINE_FIELDS = {"timestamp", "op", "hash_ids", "block_tokens", "block_bytes"}


def kv_for(num_tokens: int) -> np.ndarray:
    return np.ones((2, 2, 1, num_tokens, 4), np.float16)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def serve(pc: PrefixCache, prompts: list[list[int]]) -> None:
    """What a serving loop does per request: reuse the cached prefix, store the rest."""
    for tokens in prompts:
        pc.retrieve(tokens)
        pc.store(tokens, kv_for(len(tokens)))


def prompts_with_shared_prefixes(seed: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, 1000, 3 * CHUNK)) for _ in range(3)]
    return [
        [int(t) for t in systems[rng.integers(3)] + list(rng.integers(0, 1000, 2 * CHUNK + 1))]
        for _ in range(count)
    ]


def test_retrieves_and_stores_are_logged_with_chained_ids_and_no_tokens(make_pool, tmp_path):
    log = tmp_path / "access.log"
    pool = make_pool("4M", page_size="4K", access_log=log)
    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    tokens = list(range(1000, 1022))  # 5 chunks and 2 tokens
    serve(pc, [tokens, tokens[:8] + [7] * 14])
    retrieve, store, again, store2 = lines_of(log)
    keys = pc.chunk_keys(tokens)
    ids = [chunk_id(key) for key in keys]
    assert retrieve == {
        **{k: retrieve[k] for k in ("timestamp",)},
        "op": "retrieve",
        "hash_ids": ids,
        "hit": 0,
        "input_length": 22,
        "block_tokens": CHUNK,
        "block_bytes": CHUNK * LAYOUT.token_bytes,
    }
    assert store["op"] == "store" and store["hash_ids"] == ids
    assert (store["parent"], store["depth"]) == (0, 0)
    assert again["hit"] == 2 and again["hash_ids"][:2] == ids[:2]
    assert store2["parent"] == ids[1] and store2["depth"] == 2 and len(store2["hash_ids"]) == 3
    for line in (retrieve, store, again, store2):
        assert LINE_FIELDS <= set(line) <= LINE_FIELDS | {"hit", "input_length", "parent", "depth"}
        assert all(0 < i < 2**63 for i in line["hash_ids"])
    assert os.stat(log).st_mode & 0o777 == 0o600


def test_the_log_replays_in_simulate_as_a_mooncake_trace_of_the_same_prompts(make_pool, tmp_path):
    log, mooncake = tmp_path / "access.log", tmp_path / "mooncake.jsonl"
    pool = make_pool("8M", page_size="4K", access_log=log)
    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    prompts = prompts_with_shared_prefixes(seed=3, count=60)
    serve(pc, prompts)
    with mooncake.open("w") as f:
        for tokens in prompts:
            ids = [chunk_id(key) for key in pc.chunk_keys(tokens)]
            f.write(json.dumps({"hash_ids": ids, "input_length": len(tokens)}) + "\n")
    logged, direct = read_trace(log), read_trace(mooncake, block_tokens=CHUNK)
    assert logged.block_tokens == CHUNK and logged.num_requests == 60
    np.testing.assert_array_equal(logged.blocks, direct.blocks)
    np.testing.assert_array_equal(logged.input_tokens, direct.input_tokens)
    runs = runs_for(["lru", "fifo"], [4, 12])
    replayed = [(o.policy, o.block_hits) for o in execute(logged, runs, jobs=1)]
    assert replayed == [(o.policy, o.block_hits) for o in execute(direct, runs, jobs=1)]
    assert max(hits for _, hits in replayed) > 0  # the shared system prompts are reused
    doc = cortex_json("simulate", str(log), "--capacity", "12", "--policy", "lru")
    assert doc["trace"]["requests"] == 60 and doc["trace"]["block_tokens"] == CHUNK
    # a size is reckoned in the log's own chunk bytes, not a guessed model's
    doc = cortex_json("simulate", str(log), "--size", "4K", "--policy", "lru")
    assert doc["results"][0]["capacity_blocks"] == 4096 // (CHUNK * LAYOUT.token_bytes)


def test_a_switch_by_one_process_is_followed_by_another_already_attached(make_pool, tmp_path):
    """Every process logs to the file the header names now: no reopen needed."""
    pool = make_pool("4M", page_size="4K")
    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    assert pool.access_log is None
    pc.retrieve(list(range(8)))
    log = tmp_path / "later.log"
    switch = textwrap.dedent(
        f"""
        import kvcache
        with kvcache.open({pool.name!r}) as pool:
            pool.set_access_log({str(log)!r}, "1M")
        """
    )
    subprocess.run([sys.executable, "-c", switch], check=True, timeout=60)
    pc.retrieve(list(range(8)))
    assert [line["op"] for line in lines_of(log)] == ["retrieve"]
    assert pool.access_log.spec == LogSpec(log, 1 << 20)
    off = switch.replace(f'pool.set_access_log({str(log)!r}, "1M")', "pool.set_access_log(None)")
    subprocess.run([sys.executable, "-c", off], check=True, timeout=60)
    pc.retrieve(list(range(8)))
    assert pool.access_log is None and len(lines_of(log)) == 1


def test_rotation_keeps_the_log_and_its_one_old_file_under_the_cap(tmp_path):
    path = tmp_path / "access.log"
    log = AccessLog(LogSpec(path, 64 << 10))
    for i in range(3000):
        log.write({"op": "retrieve", "hash_ids": [i] * 10})
    log.close()
    old = Path(f"{path}.1")
    sizes = path.stat().st_size + old.stat().st_size
    assert 32 << 10 <= sizes <= (64 << 10) + 200  # at most one line over
    numbers = [line["hash_ids"][0] for line in lines_of(old) + lines_of(path)]
    assert numbers == list(range(numbers[0], 3000))  # the newest lines, whole and in order


WRITER = """
import os, sys, time
from pathlib import Path
from kvcache.accesslog import AccessLog, LogSpec
path, writer, go, cap = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
log = AccessLog(LogSpec(path, cap))
while not os.path.exists(go):  # all writers start together
    time.sleep(0.001)
for i in range(3000):
    log.write({"op": "retrieve", "writer": writer, "hash_ids": [i] * 20})
"""


def _write_from_processes(path: Path, cap: int, count: int = 4) -> list[dict]:
    go = path.parent / "go"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n), str(go), str(cap)])
        for n in range(count)
    ]
    time.sleep(1.0)  # every writer is importing or waiting by now
    go.touch()
    assert [w.wait(timeout=120) for w in writers] == [0] * count
    old = Path(f"{path}.1")
    return lines_of(old) + lines_of(path) if old.exists() else lines_of(path)


@pytest.mark.parametrize("cap", [64 << 20, 64 << 10], ids=["all-kept", "rotating"])
def test_concurrent_processes_write_whole_lines_each_in_order(tmp_path, cap):
    path = tmp_path / "access.log"
    lines = _write_from_processes(path, cap)  # every line parses: none interleaved
    for n in range(4):
        mine = [line["hash_ids"][0] for line in lines if line["writer"] == n]
        assert mine == sorted(mine)  # no line lost from the middle of a writer's run
        if cap > 1 << 20:
            assert mine == list(range(3000))
    total = path.stat().st_size + (Path(f"{path}.1").stat().st_size if cap < 1 << 20 else 0)
    assert total <= cap + 4 * 200  # a line per writer over, at most


def test_a_log_that_cannot_be_written_is_skipped_with_one_warning(make_pool, tmp_path, caplog):
    folder = tmp_path / "logs"
    folder.mkdir()
    pool = make_pool("4M", page_size="4K", access_log=folder / "access.log")
    pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
    (folder / "access.log").unlink()
    folder.rmdir()
    tokens = list(range(12))
    assert pc.store(tokens, kv_for(12)) == 12
    assert pc.retrieve(tokens)[1] == 12  # the cache works on
    warnings = [r for r in caplog.records if "access log" in r.getMessage()]
    assert len(warnings) == 1 and "skipping it" in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"access_log": "/nonexistent-folder/a.log"}, "cannot write the access log"),
        ({"access_log": "/"}, "cannot write the access log"),
        ({"access_log": "a.log", "access_log_size": "1K"}, "too small"),
        ({"access_log": "a.log", "access_log_size": "lots"}, "log size"),
        ({"access_log_size": "1M"}, "needs --access-log"),
    ],
)
def test_bad_access_log_arguments_are_refused_before_anything_is_made(
    names, tmp_path, monkeypatch, kwargs, says
):
    monkeypatch.chdir(tmp_path)
    name = names()
    with pytest.raises(kvcache.InvalidArgument) as caught:
        kvcache.create(name, "4M", **kwargs)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert name not in kvcache.list_pools()


def test_cli_create_status_switch_and_errors(names, tmp_path):
    name, log = names(), tmp_path / "access.log"
    created = cortex("create", name, "--size", "4M", "--access-log", str(log))
    assert created.returncode == 0, created.stderr
    assert cortex_json("status", name)["access_log"] == {"path": str(log), "max_bytes": 64 << 20}
    assert "access log" in cortex("status", name).stdout
    doc = cortex_json("access-log", name, str(tmp_path / "b.log"), "--max-size", "1M")
    assert doc["access_log"] == {"path": str(tmp_path / "b.log"), "max_bytes": 1 << 20}
    assert cortex_json("access-log", name, "--off")["access_log"] is None
    assert cortex_json("status", name)["access_log"] is None
    for args, says in [
        ((name,), "give a FILE"),
        ((name, str(log), "--off"), "give a FILE"),
        ((name, "--off", "--max-size", "1M"), "--max-size goes with a FILE"),
        ((name, "/nonexistent-folder/x.log"), "cannot write the access log"),
        (("no-such-pool", str(log)), "no-such-pool"),
    ]:
        result = cortex("access-log", *args)
        assert result.returncode == 1 and says in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    assert cortex_json("status", name)["access_log"] is None  # nothing changed


def test_restore_replace_keeps_the_access_log(make_pool, tmp_path):
    log = tmp_path / "access.log"
    pool = make_pool("4M", page_size="4K", access_log=log, access_log_size="1M")
    PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK).store(list(range(8)), kv_for(8))
    snapshot = kvcache.persist(pool, tmp_path / "pool.kvsnap")
    name = pool.name
    pool.close()
    with kvcache.restore(name, snapshot, replace=True) as restored:
        assert restored.access_log.spec == LogSpec(log, 1 << 20)
        PrefixCache(restored, "model", LAYOUT, chunk_tokens=CHUNK).retrieve(list(range(8)))
    assert [line["op"] for line in lines_of(log)] == ["store", "retrieve"]
