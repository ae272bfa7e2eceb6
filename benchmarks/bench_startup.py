"""How long a ``kvcache`` command takes to start: ``list`` and ``status`` in fresh processes,
beside the floors under them.

Run from the repository root::

    .venv/bin/python benchmarks/bench_startup.py          # about 30 s
    .venv/bin/python benchmarks/bench_startup.py --quick  # smoke variant (CI)
    .venv/bin/python benchmarks/bench_startup.py --baseline /tmp/main/src  # beside another tree

``--baseline SRC`` runs the ``kvcache`` rows a second time with ``SRC`` (another checkout's
``src``, e.g. ``git archive main src | tar -x -C /tmp/main``) first on the path, in the
same rounds, so a change is measured against what it changes under the same load.

Why: an operator types ``kvcache status`` and a script runs ``kvcache list --json`` in a
loop; both should answer at once (the goal: well under 0.25 s on a quiet machine).

Method: each row runs its command in a new interpreter, the rows taking turns so that
load falls on all alike, and shows the median wall time and the median CPU time (user and
system: less swayed by other jobs than the wall time, so a better guide on a busy
machine). ``python -c pass`` is the interpreter's own start; ``import numpy`` is the floor
of any command that opens a pool (the pool's tables are numpy views). The largest imports
of ``kvcache list`` follow, from ``python -X importtime`` (cumulative, self included).

Bytecode is compiled once, in an untimed first round, into a folder of the benchmark's own
(``PYTHONPYCACHEPREFIX``), as an installed package has it (pip compiles on install):
with ``PYTHONDONTWRITEBYTECODE`` set, as on our CI machines, every start would compile
each of kvcache's modules again, and the rows would measure the compiler.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import kvcache
from bench_pool import new_pool_name, print_table

CLI = "import sys; from kvcache.cli import main; sys.exit(main(sys.argv[1:]))"


Row = tuple[list[str], dict[str, str]]
"""A command and the environment it runs in."""


def _rows(name: str, baseline: str | None, pycache: str) -> dict[str, Row]:
    python = [sys.executable]
    here = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    here["PYTHONPYCACHEPREFIX"] = pycache
    rows: dict[str, Row] = {
        "python -c pass": ([*python, "-c", "pass"], here),
        "python -c 'import numpy'": ([*python, "-c", "import numpy"], here),
    }
    kvcache_rows = {
        "python -c 'import kvcache'": [*python, "-c", "import kvcache"],
        "kvcache --version": [*python, "-c", CLI, "--version"],
        "kvcache list": [*python, "-c", CLI, "list"],
        "kvcache list --json": [*python, "-c", CLI, "list", "--json"],
        "kvcache status NAME": [*python, "-c", CLI, "status", name],
        "kvcache status NAME --json": [*python, "-c", CLI, "status", name, "--json"],
    }
    for label, command in kvcache_rows.items():
        rows[label] = (command, here)
        if baseline is not None:
            path = os.pathsep.join(p for p in (baseline, os.environ.get("PYTHONPATH")) if p)
            rows[f"{label} (baseline)"] = (command, {**here, "PYTHONPATH": path})
    return rows


def _timed(row: Row) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``row``."""
    command, env = row
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _largest_imports(count: int, env: dict[str, str]) -> list[tuple[str, int]]:
    """The ``count`` largest cumulative import times of ``kvcache list`` (microseconds)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CLI, "list"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    found = re.findall(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", result.stderr)
    top = [(f"{indent}{module}", int(total)) for total, indent, module in found]
    return sorted(top, key=lambda row: -row[1])[:count]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 15")
    parser.add_argument(
        "--baseline", metavar="SRC", help="also time the kvcache rows with this src first"
    )
    args = parser.parse_args(argv)
    name = new_pool_name("bench-startup")
    kvcache.create(name, "8M").close()
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-startup-pycache-") as pycache:
            rows = _rows(name, args.baseline, pycache)
            for row in rows.values():  # compiles the bytecode: not timed
                _timed(row)
            times: dict[str, list[tuple[float, float]]] = {label: [] for label in rows}
            for _ in range(3 if args.quick else 15):
                for label, row in rows.items():
                    times[label].append(_timed(row))
            largest = _largest_imports(12, rows["kvcache list"][1])
    finally:
        kvcache.destroy(name)
    wall = {label: statistics.median(w for w, _ in t) for label, t in times.items()}
    cpu = {label: statistics.median(c for _, c in t) for label, t in times.items()}
    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print_table(
        f"Start-up, fresh processes, median of {len(times['python -c pass'])} ({load})",
        ["command", "wall", "over python -c pass", "CPU"],
        [
            (
                label,
                f"{wall[label] * 1e3:.0f} ms",
                f"+{(wall[label] - wall['python -c pass']) * 1e3:.0f} ms",
                f"{cpu[label] * 1e3:.0f} ms",
            )
            for label in times
        ],
    )
    print_table("python -X importtime of kvcache list", ["module", "cumulative"], [
        (module, f"{total / 1e3:.1f} ms") for module, total in largest
    ])  # fmt: skip


if __name__ == "__main__":
    main()
