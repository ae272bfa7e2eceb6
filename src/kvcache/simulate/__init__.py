"""Capacity planning: replay a request trace through the real engine, per policy and size.

``kvcache simulate TRACE`` answers an operator's question (how big should
my pool be, and which policy?) by replaying a serving trace through scratch
pools, one per policy and capacity, beside Belady's OPT as the ceiling.

- ``traces``  the Mooncake JSONL format, read into arrays; one-line errors
- ``replay``  a trace through a real (hidden, scratch) pool under a policy
- ``optimal`` Belady's OPT, the most any policy could reuse at a capacity
- ``outcome`` block hits, prefix-hit tokens and evictions of one run
- ``plan``    capacities and policies asked for, the runs, run in processes
- ``workers`` the processes that run them, which die with the one that started them
- ``sweep``   hit ratio against capacity 0.5%-50%: curves, their knees, the size to buy
"""

from .optimal import replay_optimal
from .outcome import DEFAULT_PREFILL_TOKENS_PER_S, Outcome
from .plan import (
    DEFAULT_CAPACITIES,
    OPTIMAL,
    Run,
    SimulationError,
    capacities_in_blocks,
    execute,
    policies_named,
    runs_for,
)
from .replay import replay_pool
from .sweep import SWEEP_SHARES, Curve, curves
from .traces import MAX_LINE_BYTES, MAX_NESTING, Trace, TraceError, read_trace

__all__ = [
    "DEFAULT_CAPACITIES",
    "DEFAULT_PREFILL_TOKENS_PER_S",
    "MAX_LINE_BYTES",
    "MAX_NESTING",
    "OPTIMAL",
    "SWEEP_SHARES",
    "Curve",
    "Outcome",
    "Run",
    "SimulationError",
    "Trace",
    "TraceError",
    "capacities_in_blocks",
    "curves",
    "execute",
    "policies_named",
    "read_trace",
    "replay_optimal",
    "replay_pool",
    "runs_for",
]
