"""Output on an 80-column terminal: no value cut short (rich's default ends a cut cell
with "..."), one-line results never wrapped, a progress bar that says what it does."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import kvcache

KVCACHE = shutil.which("kvcache", path=str(Path(sys.executable).parent)) or "kvcache"
TRACE = Path(__file__).resolve().parent / "data" / "mooncake-head-400.jsonl"
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def on_terminal(args: list[str], columns: int = 80) -> tuple[int, list[str]]:
    """Run ``args`` on a pseudo-terminal ``columns`` wide: (exit code, lines shown)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # rich reads them
    process = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    output = b""
    while select.select([leader], [], [], 120)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    return process.wait(timeout=30), ESCAPES.sub("", output.decode()).splitlines()


def test_simulate_at_80_columns_shows_every_policy_and_figure_whole():
    code, lines = on_terminal([KVCACHE, "simulate", str(TRACE), "--capacity", "5%"])
    assert code == 0, lines
    table = [line for line in lines if re.search(r"\d+%", line) and "━" not in line]
    assert all(len(line) <= 80 for line in table), table
    assert not any("…" in line for line in lines), lines
    for policy in ("opt", "lru", "priority", "s3fifo", "prefix"):
        row = rf"(^|\s){policy}\s+\d+\.\d\d%\s+\d+%\s+[\d,]+ \(\d+\.\d%\)\s+\d+ s\s+[\d,]+$"
        assert any(re.search(row, line) for line in table), (policy, table)
    assert any(line.endswith("the most any policy could reuse") for line in lines)  # unwrapped


def test_persist_on_a_narrow_terminal_keeps_its_path_whole_and_labels_its_bar(tmp_path):
    name = f"narrow-{os.getpid()}"
    target = tmp_path / ("a-long-folder-name-" * 3) / "snapshot-with-a-long-name.kvsnap"
    with kvcache.create(name, "8M") as pool:
        pool.put("k", b"v" * 100_000)
    try:
        code, lines = on_terminal([KVCACHE, "persist", name, "--path", str(target)], columns=60)
    finally:
        kvcache.destroy(name)
    assert code == 0, lines
    assert any(str(target) in line for line in lines), lines  # one line, never wrapped
