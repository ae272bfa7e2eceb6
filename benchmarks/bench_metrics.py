"""The cost of the operational counters and latency histograms (issue 14) on put and get.

Run from the repository root::

    .venv/bin/python benchmarks/bench_metrics.py            # 5 interleaved rounds, ~2 minutes
    .venv/bin/python benchmarks/bench_metrics.py --quick    # smoke variant (CI)

Method: as ``bench_versions`` (``bench_pool.measure_pool_ops`` in a fresh child process per
variant, variants interleaved round by round, median over rounds), for 4 KiB and 1 MiB
values, four variants side by side in one run:

- ``before``: revision 06fdda5, the last before the metrics region (no new counters);
- ``latency off``: this tree with ``KVCACHE_LATENCY_SAMPLE=0`` (counters only);
- ``default``: this tree as shipped (counters, one op in 16 timed);
- ``every op``: ``KVCACHE_LATENCY_SAMPLE=1`` (every op timed: why the default samples).

The last columns are each variant's ops/s over ``before``'s (1.00 = no cost; the goal is
the default within 3%). It prints a table and exits 0 (it is not a test).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench_pool import REPO, KiB, MiB, fmt_int, fmt_size, print_table
from bench_versions import measure, unpack_revision

BASE = "06fdda5"
CASES = ((4 * KiB, 4096), (MiB, 32))
VARIANTS = {
    "before": None,
    "latency off": {"KVCACHE_LATENCY_SAMPLE": "0"},
    "default": {},
    "every op": {"KVCACHE_LATENCY_SAMPLE": "1"},
}
OPS = ("put", "get", "get_into")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="one round of short repeats")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        base_src = unpack_revision(BASE, Path(tmp))
        if base_src is None:
            print(f"revision {BASE} is not in this clone: nothing to compare")
            return 0
        for size, count in CASES:
            runs: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
            for _ in range(rounds):
                for label, environ in VARIANTS.items():
                    src = base_src if environ is None else REPO / "src"
                    runs[label].append(measure(src, size, count, False, args.quick, environ))
            for op in OPS:
                medians = {label: statistics.median(r[op] for r in runs[label]) for label in runs}
                base = medians["before"]
                rows.append(
                    [
                        fmt_size(size),
                        op,
                        *[fmt_int(medians[label]) for label in VARIANTS],
                        *[f"{medians[label] / base:.3f}" for label in list(VARIANTS)[1:]],
                    ]
                )
    print_table(
        f"Counters and latency histograms: ops/s, median of {rounds} interleaved rounds",
        [
            "value",
            "operation",
            *VARIANTS,
            *[f"{label}/before" for label in list(VARIANTS)[1:]],
        ],
        rows,
        ["put overwrites; get returns new bytes; get_into fills one buffer."],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
