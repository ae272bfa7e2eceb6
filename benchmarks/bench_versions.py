"""Before and after: put/get throughput of another revision's kvcache beside this tree's.

Run from the repository root::

    .venv/bin/python benchmarks/bench_versions.py               # against d43eee7, a minute
    .venv/bin/python benchmarks/bench_versions.py --base REV    # any revision with the same API
    .venv/bin/python benchmarks/bench_versions.py --quick       # smoke variant (CI)

Why: a change to the hot paths (here: per-entry checksums and kernel-held
liveness) must show its cost as a ratio measured side by side, on
the same machine in the same minute, not against figures from another day.

Method: ``git archive REV src`` is unpacked into a temporary folder. Each
variant runs ``bench_pool.measure_pool_ops`` (warm pool, overwriting put,
get, get_into; median of repeats) in a fresh child process whose
``PYTHONPATH`` selects which kvcache it imports. Variants are interleaved
round by round (base, this tree, this tree with ``verify_reads``), and the
table shows the median over rounds of each variant's ops/s, and this tree's
over the base's. Values are random bytes with a fixed seed. It prints a table
and exits 0 (it is not a test); if the base revision is not in this clone it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench_pool import REPO, KiB, MiB, fmt_int, fmt_size, print_table

DEFAULT_BASE = "d43eee7"
"""The last commit before the kernel-held liveness and per-entry checksums."""
CASES = ((4 * KiB, 4096), (MiB, 32), (MiB, 256))
VARIANTS = (("base", False), ("this tree", False), ("this tree, verify_reads", True))

_CHILD = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import bench_pool
size, count, verify, quick = json.loads(sys.argv[1])
settings = bench_pool.QUICK if quick else bench_pool.FULL
options = {{"verify_reads": True}} if verify else {{}}
value = bench_pool.random_bytes(size)
print(json.dumps(bench_pool.measure_pool_ops(value, count, settings, **options)))
"""


def unpack_revision(rev: str, into: Path) -> Path | None:
    """``src`` of ``rev`` unpacked under ``into``; None if this clone lacks the revision."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"], capture_output=True
    )
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def measure(
    src: Path,
    size: int,
    count: int,
    verify: bool,
    quick: bool,
    environ: dict[str, str] | None = None,
) -> dict[str, float]:
    """One variant's rates, in a child process that imports kvcache from ``src`` (with
    ``environ`` added to its environment)."""
    env = {**os.environ, **(environ or {}), "PYTHONPATH": str(src)}
    code = _CHILD.format(benchmarks=str(REPO / "benchmarks"))
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps([size, count, verify, quick])],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"revision (default {DEFAULT_BASE})")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--quick", action="store_true", help="one round of short repeats")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        base_src = unpack_revision(args.base, Path(tmp))
        if base_src is None:
            print(f"revision {args.base} is not in this clone: nothing to compare")
            return 0
        sources = {"base": base_src, "this tree": REPO / "src"}
        rows: list[list[object]] = []
        for size, count in CASES:
            rates: dict[str, list[dict[str, float]]] = {label: [] for label, _ in VARIANTS}
            for _ in range(rounds):
                for label, verify in VARIANTS:
                    src = sources["base" if label == "base" else "this tree"]
                    rates[label].append(measure(src, size, count, verify, args.quick))
            rows += table_rows(size, count, rates)
    print_table(
        f"Before ({args.base}) and after, side by side: ops/s, median of {rounds} interleaved "
        "rounds",
        ["value", "set", "operation", *[label for label, _ in VARIANTS], "after/before"],
        rows,
        [
            "set = bytes of the values cycled through; put overwrites; get returns new bytes;",
            "get_into fills one buffer. verify_reads: every read is checked against its checksum.",
        ],
    )
    return 0


def table_rows(
    size: int, count: int, rates: dict[str, list[dict[str, float]]]
) -> list[list[object]]:
    rows: list[list[object]] = []
    for op in ("put", "get", "get_into"):
        medians = {label: statistics.median(r[op] for r in runs) for label, runs in rates.items()}
        rows.append(
            [
                fmt_size(size),
                fmt_size(size * count),
                op,
                *[fmt_int(medians[label]) for label, _ in VARIANTS],
                f"{medians['this tree'] / medians['base']:.2f}",
            ]
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
