"""Real llama-server processes, plain or behind the kvcache proxy, for the proxy's tests.

The binary is the one ``scripts/setup.sh`` builds into the venv (beside
``sys.executable``), or ``$KVCACHE_LLAMA_SERVER``. A missing binary fails the
test that needs it: the proxy's tests never skip, so CI cannot pass without them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvcache.integrations.llama_server.supervisor import free_port

START_TIMEOUT_S = 120.0


def server_binary() -> str:
    """The llama-server the tests run; fails the test if there is none."""
    given = os.environ.get("KVCACHE_LLAMA_SERVER")
    beside = Path(sys.executable).parent / "llama-server"
    found = given or (str(beside) if beside.exists() else shutil.which("llama-server"))
    if not found or not os.access(found, os.X_OK):
        pytest.fail(
            "no llama-server binary: scripts/setup.sh --llama-cpp builds .venv/bin/llama-server"
        )
    return found


def server_args(model: Path, context: int = 2048, slots: int = 1) -> list[str]:
    """Options for a small, quick, deterministic server on ``model``."""
    return ["-m", str(model), "-c", str(context), "-np", str(slots), "-t", "1", "--no-webui"]


def call(
    url: str, path: str, doc: dict[str, Any] | None = None, timeout_s: float = 120.0
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request (POST with a JSON body, GET without): status, headers, body bytes."""
    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(url + path, data=data, method="GET" if doc is None else "POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def complete(url: str, prompt: str | list[int], **options: Any) -> dict[str, Any]:
    """A greedy /completion of a few tokens; its JSON answer (asserting HTTP 200).

    Compare answers by their ``tokens``: the tiny model often generates byte tokens,
    whose ``content`` is a partial UTF-8 sequence rendered as the server sees fit.
    """
    doc = {"prompt": prompt, "n_predict": 8, "temperature": 0.0, "seed": 0, **options}
    doc.setdefault("return_tokens", True)
    status, _, body = call(url, "/completion", doc)
    assert status == 200, body[:300]
    return json.loads(body)  # type: ignore[no-any-return]


class Process:
    """A child process whose output goes to a log file; stopped by :meth:`stop`."""

    def __init__(self, command: list[str], log: Path, ready_path: str) -> None:
        self.log = log
        self._file = open(log, "ab")  # noqa: SIM115 -- closed in stop()
        self.process = subprocess.Popen(command, stdout=self._file, stderr=subprocess.STDOUT)
        self._ready_path = ready_path

    def wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"exited with {self.process.returncode}: {self.tail()}")
            try:
                if call(url, self._ready_path, timeout_s=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        pytest.fail(f"not ready in {START_TIMEOUT_S} s: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_bytes()[-3000:].decode(errors="replace")

    def stop(self, signum: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._file.close()
        return code


class Server(Process):
    """A plain llama-server on a free port."""

    def __init__(self, args: list[str], log: Path, *extra: str) -> None:
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        super().__init__([server_binary(), *args, *extra, "--port", str(port)], log, "/health")
        self.wait_ready(self.url)


class Proxy(Process):
    """``cortex cache llama-server`` in its own process, on a free port."""

    def __init__(self, pool: str, args: list[str], log: Path, *options: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "kvcache", "llama-server", "--pool", pool]
        command += ["--listen", f"127.0.0.1:{port}", "--server-bin", server_binary()]
        super().__init__([*command, *options, "--", *args], log, "/kvcache/stats")
        self.wait_ready(self.url)

    def stats(self) -> dict[str, Any]:
        status, _, body = call(self.url, "/kvcache/stats")
        assert status == 200
        return json.loads(body)  # type: ignore[no-any-return]

    def wait_saved(self, count: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """The proxy's stats once ``count`` slot saves (or failed saves) are done."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            done = stats["counts"].get("saved", 0) + stats["problems"].get("save_failed", 0)
            if done >= count or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)
