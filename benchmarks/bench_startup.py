"""How long a ``kvcache`` command takes to start: ``list`` and ``status`` in fresh processes,
beside the floors under them.

Run from the repository root::

    .venv/bin/python benchmarks/bench_startup.py          # about 30 s
    .venv/bin/python benchmarks/bench_startup.py --quick  # smoke variant (CI)

Why: an operator types ``kvcache status`` and a script runs ``kvcache list --json`` in a
loop; both should answer at once (the goal: well under 0.25 s on a quiet machine).

Method: each row runs its command in a new interpreter, the rows taking turns so that
load falls on all alike, and shows the median wall time. ``python -c pass`` is the
interpreter's own start; ``import numpy`` is the floor of any command that opens a pool
(the pool's tables are numpy views). The largest imports of ``kvcache list`` follow,
from ``python -X importtime`` (cumulative microseconds, self included).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import kvcache
from bench_pool import new_pool_name, print_table

CLI = "import sys; from kvcache.cli import main; sys.exit(main(sys.argv[1:]))"


def _rows(name: str) -> dict[str, list[str]]:
    python = [sys.executable]
    return {
        "python -c pass": [*python, "-c", "pass"],
        "python -c 'import numpy'": [*python, "-c", "import numpy"],
        "python -c 'import kvcache'": [*python, "-c", "import kvcache"],
        "kvcache list": [*python, "-c", CLI, "list"],
        "kvcache list --json": [*python, "-c", CLI, "list", "--json"],
        f"kvcache status {name}": [*python, "-c", CLI, "status", name],
    }


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _largest_imports(count: int) -> list[tuple[str, int]]:
    """The ``count`` largest cumulative import times of ``kvcache list`` (microseconds)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CLI, "list"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.findall(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", result.stderr)
    top = [(f"{indent}{module}", int(total)) for total, indent, module in found]
    return sorted(top, key=lambda row: -row[1])[:count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 15")
    args = parser.parse_args(argv)
    name = new_pool_name("bench-startup")
    kvcache.create(name, "8M").close()
    try:
        rows = _rows(name)
        times: dict[str, list[float]] = {label: [] for label in rows}
        for _ in range(3 if args.quick else 15):
            for label, command in rows.items():
                times[label].append(_timed(command))
    finally:
        kvcache.destroy(name)
    floor = statistics.median(times["python -c pass"])
    print_table(
        f"Start-up, fresh processes, median of {len(times['python -c pass'])}",
        ["command", "median", "over python -c pass"],
        [
            (
                label,
                f"{statistics.median(t) * 1e3:.0f} ms",
                f"+{(statistics.median(t) - floor) * 1e3:.0f} ms",
            )
            for label, t in times.items()
        ],
    )
    print_table("python -X importtime of kvcache list", ["module", "cumulative"], [
        (module, f"{total / 1e3:.1f} ms") for module, total in _largest_imports(12)
    ])  # fmt: skip


if __name__ == "__main__":
    main()
