"""``cortex cache simulate``: the real console script on a real trace, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcache.simulate import execute, read_trace, runs_for
from test_cli import cortex, cortex_json

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
