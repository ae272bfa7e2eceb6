"""The documentation cannot drift: the site builds with ``mkdocs build --strict`` (a broken
link or a stale API reference fails), its Python blocks run, every ``kvcache`` command
line in it parses with the real grammar, and the README's links lead somewhere.

A block that needs a model is preceded by ``<!-- run with: NAME -->``: it runs after the
code of ``docs_given.GIVEN[NAME]``, which builds a tiny one (nothing is downloaded). A block
that cannot run here (it needs a GPU, a server or a path of a real install) is preceded by
``<!-- not run: REASON -->``; the reason is required. The programs of this repository
that a shell block runs (``./scripts/demo.sh``, ``python examples/store_kv.py``,
``sudo contrib/systemd/install.sh``) must be there, and a JSON argument must parse.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs_given import GIVEN
from kvcache.cli import _joined_negative_values
from kvcache.cli.parser import UsageError, build

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
RUN_WITH = re.compile(r"<!-- run with: (\S+) -->")
COMMAND = re.compile(r"^(kvcache|cortex cache) (.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    language: str
    text: str
    not_run: str | None  # the reason, when the block is marked not to run
    given: str | None  # what it runs with (a key of docs_given.GIVEN)


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    found, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        if lines[index].startswith("```"):
            start, language = index, lines[index][3:].strip()
            index += 1
            while not lines[index].startswith("```"):
                index += 1
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            reason = NOT_RUN.fullmatch(before.strip())
            given = RUN_WITH.fullmatch(before.strip())
            text = "\n".join(lines[start + 1 : index])
            found.append(
                Block(
                    page,
                    start + 1,
                    language,
                    text,
                    reason and reason.group(1),
                    given and given.group(1),
                )
            )
        index += 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (in dev) brings mkdocs")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "api" / "index.html").read_text().count("kvcache.create") > 0


def test_the_readme_links_lead_somewhere() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def runs_with_vllm(page: Path) -> bool:
    """Whether a page's blocks need vLLM: they run in vLLM's venv, beside its tests."""
    return any(b.given and "vllm" in GIVEN[b.given].needs for b in blocks(page))


PYTHON_PAGES = [
    p for p in PAGES if any(b.language == "python" and not b.not_run for b in blocks(p))
]


@pytest.mark.parametrize(
    "page", [p for p in PYTHON_PAGES if not runs_with_vllm(p)], ids=lambda page: page.name
)
def test_the_python_blocks_of_a_page_run(page: Path, disk: Path) -> None:
    run_python_blocks(page, disk)


def run_python_blocks(page: Path, disk: Path) -> None:
    """A page's Python blocks run in order in one interpreter, as a reader would paste them,
    each after what it is given, with pools in a folder of their own (``$KVCACHE_SHM_DIR``,
    on tmpfs) and ``$KVCACHE_HOME`` (the default folder of snapshots and disk pools) and
    the working folder on a disk."""
    run = [b for b in blocks(page) if b.language == "python" and not b.not_run]
    givens = [GIVEN[b.given] for b in run if b.given]
    missing = sorted({n for g in givens for n in g.needs if importlib.util.find_spec(n) is None})
    if missing:
        pytest.skip(f"{page.name} runs with {', '.join(missing)}, not installed")
    code = "\n\n".join((GIVEN[b.given].code if b.given else "") + b.text for b in run)
    shm = Path("/dev/shm") / f"kvcache-docs-{uuid.uuid4().hex[:10]}"
    shm.mkdir()
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=disk,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "KVCACHE_SHM_DIR": str(shm), "KVCACHE_HOME": str(disk)},
        )
    finally:
        shutil.rmtree(shm)
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_given_a_page_names_exists() -> None:
    named = {b.given for b in ALL if b.given}
    assert named and named <= set(GIVEN)
    assert all(b.language == "python" for b in ALL if b.given)


def command_line(line: str, language: str) -> str | None:
    """The ``kvcache ...`` command on a line of a block, without prompt, pipe, redirection
    or comment.

    In a shell block every line is a command; in an output block only a ``$ `` line is.
    """
    if language == "":
        if not line.startswith("$ "):
            return None
        line = line[2:]
    line = re.split(r" \| | > | +# ", line)[0].strip()
    return line if COMMAND.match(line) and not line.endswith("\\") else None


COMMAND_LINES = [
    (block, command)
    for block in ALL
    if block.language in ("", "bash") and not block.not_run
    for line in block.text.splitlines()
    if (command := command_line(line, block.language))
]


@pytest.mark.parametrize(
    ("block", "line"),
    COMMAND_LINES,
    ids=[f"{block.page.name}:{block.line}:{line[:60]}" for block, line in COMMAND_LINES],
)
def test_every_command_line_in_the_docs_parses(block: Block, line: str) -> None:
    match = COMMAND.match(line)
    assert match is not None
    args = _joined_negative_values(shlex.split(match.group(2)))
    try:
        build("kvcache").parse_args(args)
    except UsageError as exc:
        pytest.fail(f"{block.page.name}:{block.line}: {line!r} does not parse: {exc}")
    except SystemExit as exc:  # --help, --version: printed, and a clean exit
        assert exc.code == 0


def shell_commands(block: Block) -> list[list[str]]:
    """The commands of a shell block (or the ``$ `` lines of an output block), split as the
    shell would: comments dropped, ``\\``-continued lines and quotes across lines joined,
    apart at ``|``, ``&&`` and ``;``, redirections left out."""
    lines = block.text.splitlines()
    if block.language == "":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands: list[list[str]] = [[]]
    pending = ""
    for line in lines:
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending.replace("\\\n", " "), comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        if pending.endswith("\\"):
            continue
        pending, redirected = "", False
        for word in words:
            if word in ("|", "&&", ";"):
                commands.append([])
            elif word in (">", ">>", "2>", "<"):
                redirected = True
            elif not redirected:
                commands[-1].append(word)
            else:
                redirected = False
        commands.append([])
    return [words[1:] if words[0] == "sudo" else words for words in commands if words]


SHELL_COMMANDS = [
    (block, words)
    for block in ALL
    if block.language in ("", "bash") and not block.not_run
    for words in shell_commands(block)
]


def test_the_programs_a_shell_block_runs_are_there() -> None:
    checked = 0
    for block, words in SHELL_COMMANDS:
        where = f"{block.page.name}:{block.line}: {shlex.join(words)}"
        program = words[1] if words[0] in ("python", "python3") and len(words) > 1 else words[0]
        if "/" in program and not program.startswith(("/", ".venv")):  # .venv*: made by setup
            path = ROOT / program
            assert path.is_file(), f"{where}: no {program} in the repository"
            assert program.endswith(".py") or os.access(path, os.X_OK), f"{where}: not executable"
            checked += 1
    assert checked >= 5


def test_a_json_argument_in_a_shell_block_parses() -> None:
    configs = [
        json.loads(words[i + 1])
        for _, words in SHELL_COMMANDS
        for i, word in enumerate(words[:-1])
        if word == "--kv-transfer-config"
    ]
    assert configs
    for config in configs:
        assert importlib.util.find_spec(config["kv_connector_module_path"]) is not None
        assert config["kv_connector"] == "KVCacheConnector"


def test_the_docs_show_many_command_lines() -> None:
    assert len(COMMAND_LINES) >= 50


def test_every_block_not_run_says_why() -> None:
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if "<!-- not run" in line:
                assert NOT_RUN.fullmatch(line.strip()), f"{page.name}:{number}: give a reason"


def _extras() -> set[str]:
    """The extras pyproject.toml defines."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]")[1].split("\n[")[0]
    return set(re.findall(r"^([\w-]+) = \[", section, re.MULTILINE))


def test_every_pip_install_hint_names_extras_that_exist() -> None:
    files = [*PAGES, *sorted((ROOT / "src").rglob("*.py"))]
    hints = {
        (path.name, extra)
        for path in files
        for extras in re.findall(r"kvcache\[([\w,-]+)\]", path.read_text())
        for extra in extras.split(",")
    }
    assert len(hints) >= 10
    assert {extra for _, extra in hints} >= {"redis", "metrics", "plot", "transformers", "all"}
    assert [hint for hint in hints if hint[1] not in _extras()] == []
