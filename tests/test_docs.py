"""The documentation cannot drift: the site builds with ``mkdocs build --strict`` (a broken
link or a stale API reference fails), its Python blocks run, every ``kvcache`` command
line in it parses with the real grammar, and the README's links lead somewhere.

A block that cannot run here (it needs a model, a GPU, a server or a path of a real
install) is preceded by ``<!-- not run: REASON -->``; the reason is required.
"""

from __future__ import annotations

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

from kvcache.cli import _joined_negative_values
from kvcache.cli.parser import UsageError, build

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
COMMAND = re.compile(r"^(kvcache|cortex cache) (.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    language: str
    text: str
    not_run: str | None  # the reason, when the block is marked not to run


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
            text = "\n".join(lines[start + 1 : index])
            found.append(Block(page, start + 1, language, text, reason and reason.group(1)))
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


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(b.language == "python" and not b.not_run for b in blocks(p))],
    ids=lambda page: page.name,
)
def test_the_python_blocks_of_a_page_run(page: Path, tmp_path: Path) -> None:
    """A page's Python blocks run in order in one interpreter, as a reader would paste them,
    with pools in a folder of their own (``$KVCACHE_SHM_DIR``, on tmpfs)."""
    code = "\n\n".join(b.text for b in blocks(page) if b.language == "python" and not b.not_run)
    shm = Path("/dev/shm") / f"kvcache-docs-{uuid.uuid4().hex[:10]}"
    shm.mkdir()
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "KVCACHE_SHM_DIR": str(shm), "KVCACHE_HOME": str(tmp_path)},
        )
    finally:
        shutil.rmtree(shm)
    assert result.returncode == 0, result.stderr[-3000:]


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
