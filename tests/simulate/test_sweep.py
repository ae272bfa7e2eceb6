"""``simulate --sweep``: curves, their knees and the size to buy, by hand and through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcache.cli import run
from kvcache.simulate import SWEEP_SHARES, Curve, curves
from kvcache.simulate.outcome import Outcome

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake-head-400.jsonl"


def outcome(policy: str, capacity: int, hits: int) -> Outcome:
    return Outcome(policy, capacity, hits, 100, hits, 100, 0, 0.0)


def test_the_knee_is_the_point_farthest_above_the_chord_on_a_log_scale():
    # doublings: 10% -> 30% -> 35% -> 37% -> 38%: the gain per doubling drops after the 2nd
    curve = Curve("lru", (100, 200, 400, 800, 1600), (0.10, 0.30, 0.35, 0.37, 0.38))
    assert curve.knee() == 200


def test_a_straight_or_falling_curve_has_no_knee():
    assert Curve("lru", (100, 200, 400), (0.1, 0.2, 0.3)).knee() is None  # linear in log
    assert Curve("lru", (100, 200, 400), (0.3, 0.3, 0.3)).knee() is None
    assert Curve("lru", (100, 200), (0.1, 0.3)).knee() is None


def test_the_size_to_buy_is_interpolated_on_a_log_scale():
    curve = Curve("lru", (100, 400, 1600), (0.10, 0.20, 0.30))
    assert curve.size_for(0.05) == 100.0  # the smallest capacity already does
    assert curve.size_for(0.15) == pytest.approx(200.0)  # halfway in log between 100 and 400
    assert curve.size_for(0.30) == pytest.approx(1600.0)
    assert curve.size_for(0.31) is None


def test_curves_group_outcomes_by_policy_in_capacity_order():
    runs = [
        outcome("opt", 20, 9),
        outcome("lru", 20, 5),
        outcome("opt", 10, 6),
        outcome("lru", 10, 2),
    ]
    assert curves(runs) == [
        Curve("opt", (10, 20), (0.06, 0.09)),
        Curve("lru", (10, 20), (0.02, 0.05)),
    ]


def test_sweep_replays_every_share_and_reports_knees_and_sizes(capsys):
    args = ["simulate", str(TRACE), "--sweep", "--policy", "lru", "--target-hit", "3%"]
    assert run([*args, "--jobs", "1", "--requests", "150", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["results"]) == 2 * len(SWEEP_SHARES)  # opt and lru at every share
    for row in doc["sweep"]:
        runs = sorted(
            (r for r in doc["results"] if r["policy"] == row["policy"]),
            key=lambda r: r["capacity_blocks"],
        )
        curve = Curve(
            row["policy"],
            tuple(r["capacity_blocks"] for r in runs),
            tuple(r["hit_ratio"] for r in runs),
        )
        assert row["knee_blocks"] == curve.knee()
        assert row["target_blocks"] == curve.size_for(0.03)
    assert {row["policy"] for row in doc["sweep"]} == {"opt", "lru"}


def test_target_hit_without_sweep_is_refused(capsys):
    assert run(["simulate", str(TRACE), "--target-hit", "10%"]) == 1
    assert "add --sweep" in capsys.readouterr().err


def test_sweep_and_capacity_cannot_be_mixed(capsys):
    assert run(["simulate", str(TRACE), "--sweep", "--capacity", "5%"]) != 0
    assert "not allowed with" in capsys.readouterr().err
