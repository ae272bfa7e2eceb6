"""What a simulation runs: the capacities and policies asked for, and the runs they make.

Capacities are given as shares of the trace's distinct blocks (``5%``), as
block counts (``2000``), or as pool sizes (``16G``) with the bytes a block of
the user's model takes (tokens per block x KV bytes per token).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from ..errors import InvalidArgument, KVCacheError
from ..policies import POLICIES, get_policy
from ..units import parse_size
from .optimal import replay_optimal
from .outcome import Outcome
from .replay import replay_pool
from .traces import Trace
from .workers import worker_pool

DEFAULT_CAPACITIES = ("1%", "2%", "5%", "10%", "20%")
OPTIMAL = "opt"


class SimulationError(KVCacheError):
    """A simulation that could not finish; the message says why and what to try."""


@dataclass(frozen=True)
class Run:
    policy: str  # a pool policy, or OPTIMAL
    capacity_blocks: int
    eviction_samples: int = 64


def capacities_in_blocks(
    trace: Trace,
    shares_or_counts: Sequence[str] = (),
    sizes: Sequence[str] = (),
    block_bytes: int = 0,
) -> list[int]:
    """The capacities asked for, in blocks, ascending and without repeats.

    Raises:
        InvalidArgument: a capacity that is not ``N%`` (0-100], a block count or a
            size, or one below one block.
    """
    blocks = [_blocks_of(text, trace.num_distinct) for text in shares_or_counts]
    for text in sizes:
        size = parse_size(text, what="simulated pool size")
        if size < block_bytes:
            raise InvalidArgument(
                f"a {text} pool holds no {block_bytes}-byte block: give a larger --size"
            )
        blocks.append(size // block_bytes)
    return sorted(set(blocks))


def _blocks_of(text: str, distinct: int) -> int:
    spec = text.strip()
    try:
        if spec.endswith("%"):
            share = float(spec[:-1])
            if not 0 < share <= 100:
                raise ValueError
            return max(1, round(distinct * share / 100))
        count = int(spec)
        if count < 1:
            raise ValueError
        return count
    except ValueError:
        raise InvalidArgument(
            f"bad capacity {text!r}: give a share of the distinct blocks (0-100%, e.g. 5%) "
            "or a number of blocks"
        ) from None


def policies_named(names: Iterable[str]) -> list[str]:
    """The pool policies named (``all``: every one), in registry order.

    Raises:
        InvalidArgument: an unknown name (the message lists the valid ones).
    """
    wanted = {name.strip() for name in names} - {OPTIMAL}
    if "all" in wanted:
        return list(POLICIES)
    for name in wanted:
        get_policy(name)
    return [name for name in POLICIES if name in wanted]


def runs_for(policies: Sequence[str], capacities: Sequence[int], samples: int = 64) -> list[Run]:
    """OPT and every policy at every capacity."""
    return [
        Run(policy, capacity, samples) for capacity in capacities for policy in (OPTIMAL, *policies)
    ]


def execute(
    trace: Trace,
    runs: Sequence[Run],
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Every run's outcome, in the order of ``runs``; ``jobs`` processes at a time
    (default: one per CPU; 1 runs them here). The worker processes die with this one
    (see ``workers``).

    Raises:
        SimulationError: a worker died (killed, out of memory) before its run ended.
    """
    jobs = min(jobs or os.cpu_count() or 1, len(runs)) or 1
    outcomes: list[Outcome] = []
    if jobs == 1:
        for run in runs:
            outcomes.append(_run(trace, run))
            if progress:
                progress(len(outcomes), len(runs))
        return outcomes
    # The slowest runs (pool replays at small capacities evict on nearly every put) start first.
    order = sorted(
        range(len(runs)), key=lambda i: (runs[i].policy == OPTIMAL, runs[i].capacity_blocks)
    )
    done: dict[int, Outcome] = {}
    try:
        with worker_pool(jobs, _keep, (trace,)) as workers:
            futures = {workers.submit(_run_kept, runs[i]): i for i in order}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
                if progress:
                    progress(len(done), len(runs))
    except BrokenProcessPool:
        raise SimulationError(
            "a replay worker died before its run ended (killed, or out of memory?): "
            "run again, with fewer --jobs if memory is short"
        ) from None
    return [done[i] for i in range(len(runs))]


def _run(trace: Trace, run: Run) -> Outcome:
    if run.policy == OPTIMAL:
        return replay_optimal(trace, run.capacity_blocks)
    return replay_pool(trace, run.policy, run.capacity_blocks, run.eviction_samples)


_kept: list[Trace] = []


def _keep(trace: Trace) -> None:
    """A worker's initializer: the trace, sent once per worker rather than once per run."""
    _kept.append(trace)


def _run_kept(run: Run) -> Outcome:
    return _run(_kept[0], run)
