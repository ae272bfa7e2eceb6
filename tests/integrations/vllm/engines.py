"""Start real vLLM engines in their own processes, the way users run them, and read what
they generated (``engine_run.py`` prints it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "engine_run.py"
TIMEOUT_S = 420


def engine_env(home: Path, *, multiprocess: bool = False) -> dict[str, str]:
    """The environment of an engine process: its kvcache home, 1 GiB of KV, in-process or not.

    In-process engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) start in about half the
    time; vLLM's default puts the engine core in a process of its own.
    """
    env = dict(os.environ, KVCACHE_HOME=str(home), VLLM_CPU_KVCACHE_SPACE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"
    return env


def start(config: dict[str, Any], workdir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``engine_run.py`` on ``config``; its output goes to a file next to the config."""
    path = workdir / f"engine-{len(list(workdir.glob('engine-*.json')))}.json"
    path.write_text(json.dumps(config))
    log = path.with_suffix(".log").open("w")
    return subprocess.Popen(
        [sys.executable, str(RUNNER), str(path)],
        stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
    )  # fmt: skip


def output_of(proc: subprocess.Popen[str]) -> str:
    """What the process printed (stdout and stderr)."""
    assert isinstance(proc.args, list)
    return Path(str(proc.args[-1])).with_suffix(".log").read_text()


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Wait for the engine; its exit status and output."""
    try:
        proc.wait(TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, output_of(proc)


def run(config: dict[str, Any], workdir: Path, env: dict[str, str]) -> list[list[dict[str, Any]]]:
    """Run an engine to the end; its rounds of outputs (see ``engine_run.py``).

    Raises:
        AssertionError: it failed (with the end of its output).
    """
    status, output = finish(start(config, workdir, env))
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert status == 0 and results, f"vLLM exited with {status}:\n{output[-6000:]}"
    return json.loads(results[-1][len("RESULT ") :])["rounds"]
