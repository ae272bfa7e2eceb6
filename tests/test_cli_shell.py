"""``kvcache completion SHELL`` and ``kvcache man``: written from the real parser, so a
command or option added there is completed and documented without another edit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from kvcache.cli.parser import build

VERBS = sorted(next(a for a in build("kvcache")._actions if a.dest == "command").choices)
ALIASES = {"delete"}


def _kvcache(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "kvcache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being typed), with ``script`` loaded."""
    program = (
        f"source /dev/stdin <<'EOF'\n{script}\nEOF\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_shtab_kvcache; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_choices():
    script = _kvcache("completion", "bash")
    assert sorted(_complete(script, "kvcache", "")) == VERBS
    assert _complete(script, "kvcache", "sim") == ["simulate"]
    assert _complete(script, "kvcache", "create", "llama", "--ti") == ["--tier"]
    assert _complete(script, "kvcache", "create", "llama", "--tier", "") == ["cpu", "disk"]


@pytest.mark.parametrize("shell", ["zsh", "tcsh"])
def test_the_other_shells_get_a_script_that_parses(shell):
    script = _kvcache("completion", shell)
    assert all(verb in script for verb in VERBS)
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: its script is not parsed")
    check = [shell, "-n"] if shell == "zsh" else [shell, "-n", "/dev/stdin"]
    assert subprocess.run(check, input=script, text=True, timeout=60).returncode == 0


def test_the_manual_page_renders_every_command():
    page = _kvcache("man")
    assert page.startswith(".TH KVCACHE")
    if shutil.which("man") is None:
        pytest.skip("man is not installed: the page is not rendered")
    shown = subprocess.run(
        ["man", "-l", "-"],
        input=page,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat"},
    )
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    for verb in set(VERBS) - ALIASES:
        assert f"kvcache {verb}" in shown.stdout, verb
