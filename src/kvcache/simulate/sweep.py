"""A capacity sweep: hit ratio against pool size from 0.5% to 50%, its knee, the size to buy.

``cortex cache simulate --sweep`` replays every policy (and OPT, the ceiling) at
``SWEEP_SHARES`` of the trace's distinct blocks, a geometric grid, so one run
draws the whole curve. Two readings of a curve help an operator choose:

- the **knee**: past it, doubling the pool buys little. We take the point
  farthest above the straight line from the curve's first point to its last,
  with capacity on a log scale and both axes scaled to [0, 1] (the Kneedle
  method): on a log axis every doubling costs the same, so the knee is where
  the gain per doubling falls below the curve's average.
- the **size to buy** for a target hit ratio: the smallest capacity at which
  the policy reaches it, interpolated on the log scale between the two grid
  points around it; none if even 50% falls short.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .outcome import Outcome

SWEEP_SHARES = ("0.5%", "1%", "2%", "3%", "5%", "7%", "10%", "15%", "20%", "30%", "40%", "50%")
"""Capacities of a sweep, as shares of the distinct blocks: about 1.5x apart."""


@dataclass(frozen=True)
class Curve:
    """One policy's hit ratio at each capacity of a sweep, ascending."""

    policy: str
    capacities: tuple[int, ...]  # blocks
    hit_ratios: tuple[float, ...]

    def knee(self) -> int | None:
        """The capacity (blocks) at the curve's knee; None for fewer than 3 points or a flat
        curve."""
        if len(self.capacities) < 3:
            return None
        xs = [math.log(c) for c in self.capacities]
        ys = self.hit_ratios
        if ys[-1] <= ys[0] or xs[-1] == xs[0]:
            return None
        gains = [
            (y - ys[0]) / (ys[-1] - ys[0]) - (x - xs[0]) / (xs[-1] - xs[0])
            for x, y in zip(xs, ys, strict=True)
        ]
        best = max(range(len(gains)), key=gains.__getitem__)
        return self.capacities[best] if gains[best] > 1e-9 else None  # above float noise

    def size_for(self, target: float) -> float | None:
        """The fewest blocks at which the hit ratio reaches ``target`` (0-1), interpolated on
        a log scale between grid points; None if the largest capacity falls short."""
        points = list(zip(self.capacities, self.hit_ratios, strict=True))
        if not points or points[-1][1] < target:
            return None
        if points[0][1] >= target:
            return float(points[0][0])
        for (c0, y0), (c1, y1) in itertools.pairwise(points):
            if y1 >= target:
                share = (target - y0) / (y1 - y0) if y1 > y0 else 1.0
                return math.exp(math.log(c0) + share * (math.log(c1) - math.log(c0)))
        return None  # unreachable: the last point reaches the target


def curves(outcomes: Sequence[Outcome]) -> list[Curve]:
    """A curve per policy (in the order they first appear), capacities ascending."""
    by_policy: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_policy.setdefault(outcome.policy, []).append(outcome)
    result = []
    for policy, runs in by_policy.items():
        runs.sort(key=lambda o: o.capacity_blocks)
        result.append(
            Curve(
                policy,
                tuple(o.capacity_blocks for o in runs),
                tuple(o.hit_ratio for o in runs),
            )
        )
    return result
