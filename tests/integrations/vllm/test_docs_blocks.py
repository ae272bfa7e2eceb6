"""The Python blocks of the pages that need vLLM run here, in vLLM's venv, with the runner
of ``tests/test_docs.py`` (which runs every other page's blocks in the main venv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_docs import PYTHON_PAGES, run_python_blocks, runs_with_vllm

VLLM_PAGES = [page for page in PYTHON_PAGES if runs_with_vllm(page)]


def test_the_vllm_page_is_among_them() -> None:
    assert [page.name for page in VLLM_PAGES] == ["vllm.md"]


@pytest.mark.parametrize("page", VLLM_PAGES, ids=lambda page: page.name)
def test_the_python_blocks_of_a_vllm_page_run(page: Path, disk: Path) -> None:
    run_python_blocks(page, disk)
