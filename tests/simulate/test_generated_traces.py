"""The trace generator (benchmarks/conversation_trace.py): its statistics, and that its
``chat`` shape matches what we measured on the Mooncake conversation trace."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kvcache.simulate import read_trace

_PATH = Path(__file__).parents[2] / "benchmarks" / "conversation_trace.py"
_SPEC = importlib.util.spec_from_file_location("conversation_trace", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
ct = importlib.util.module_from_spec(_SPEC)
sys.modules["conversation_trace"] = ct  # dataclasses look their module up by name
_SPEC.loader.exec_module(ct)


def test_statistics_of_a_hand_computed_trace():
    requests = [
        {"hash_ids": [0, 1, 2, 3]},  # first turn: new 0-3
        {"hash_ids": [0, 1, 2, 9]},  # continues it (run 0-2 ends at its last full block)
        {"hash_ids": [0, 5]},  # a first turn: only the root seen before
        {"hash_ids": [0, 1, 2, 9, 7, 8]},  # turn 3: run ends at request 2's last block
    ]
    stats = ct.statistics(requests)
    assert stats.num_requests == 4 and stats.num_distinct == 8 and stats.max_depth == 6
    # read by one request only: 3, 5, 7, 8 of 0, 1, 2, 3, 5, 7, 8, 9
    assert stats.read_once_share == pytest.approx(4 / 8)
    # first turns' new blocks 0, 1, 2, 3, 5: 0, 1, 2 read again
    assert stats.first_turn_reuse == pytest.approx(3 / 5)
    # turns 2-4: 9 (read again), 7, 8 (not)
    assert stats.later_turn_reuse == pytest.approx(1 / 3)
    assert stats.root_share == 1.0


def test_a_turn_field_wins_over_the_inferred_turn():
    requests = [{"hash_ids": [0, 1], "turn": 1}, {"hash_ids": [0, 1, 2], "turn": 1}]
    assert ct.statistics(requests).later_turn_reuse == 0.0  # no turn 2 at all
    assert ct.statistics([{"hash_ids": r["hash_ids"]} for r in requests]).later_turn_reuse == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_chat_traces_look_like_the_mooncake_conversation_trace(seed):
    stats = ct.statistics(ct.chat_requests(12000, seed))  # the Mooncake trace's length
    # Mooncake: 76% read once, 27.7% of first turns' new blocks read again, 14-16% of turns 2-4's
    assert 0.70 <= stats.read_once_share <= 0.80
    assert 0.24 <= stats.first_turn_reuse <= 0.32
    assert 0.11 <= stats.later_turn_reuse <= 0.19
    assert stats.root_share == 1.0  # one root block (the system prompt) in every request
    assert 200 <= stats.max_depth <= 246


def test_the_older_conversation_shape_is_kept():
    stats = ct.statistics(ct.requests(1500, 1))
    assert stats.first_turn_reuse > 0.7 and stats.later_turn_reuse > 0.7  # friendlier traffic


def test_the_command_line_writes_a_trace_simulate_reads(tmp_path, capsys):
    assert (
        ct.main(["--shape", "chat", "--requests", "50", "--seed", "4", "--max-blocks", "64"]) == 0
    )
    path = tmp_path / "chat.jsonl"
    path.write_text(capsys.readouterr().out)
    trace = read_trace(path)
    assert trace.num_requests == 50 and max(len(trace.request(i)) for i in range(50)) <= 64
    assert ct.main(["--statistics", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["num_requests"] == 50


def test_options_of_another_shape_are_refused(capsys):
    with pytest.raises(SystemExit):
        ct.main(["--shape", "chat", "--max-turns", "5"])
    assert "--shape chat has no option --max-turns" in capsys.readouterr().err
