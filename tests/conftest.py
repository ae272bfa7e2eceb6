"""Shared fixtures: real pools in /dev/shm with unique names, always destroyed.

Every test gets a private ``$KVCACHE_HOME`` (snapshots, the disk-pool registry,
default disk pools), so no registry record outlives its test or meets another's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import kvcache
from other_user import NOBODY

# tests/integrations/vllm need vLLM, which pins its own torch and transformers: they run in
# .venv-vllm, in a second pytest that scripts/test.sh starts (docs/vllm.md)
collect_ignore = [] if importlib.util.find_spec("vllm") else ["integrations/vllm"]


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$KVCACHE_HOME`` for this test only (its processes inherit it)."""
    home = tmp_path_factory.mktemp("kvcache-home")
    monkeypatch.setenv("KVCACHE_HOME", str(home))
    return home


@contextlib.contextmanager
def shm_dir_set_to(setting: str | None) -> Iterator[None]:
    """``$KVCACHE_SHM_DIR`` as ``setting`` (None: unset) for the block.

    The cleanup of a test's pools runs with the setting the test began with: a test
    that points it elsewhere would otherwise hide the pools it made in /dev/shm from
    their cleanup (its monkeypatch is undone only after the other fixtures' teardown).
    """
    with pytest.MonkeyPatch.context() as env:
        if setting is None:
            env.delenv("KVCACHE_SHM_DIR", raising=False)
        else:
            env.setenv("KVCACHE_SHM_DIR", setting)
        yield


@pytest.fixture
def pool_name() -> Iterator[str]:
    """A fresh pool name; whatever pool carries it is destroyed after the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    setting = os.environ.get("KVCACHE_SHM_DIR")
    yield name
    with shm_dir_set_to(setting):
        if name in kvcache.list_pools():
            kvcache.destroy(name)


@pytest.fixture
def names() -> Iterator[Callable[[], str]]:
    """``names()``: a fresh pool name; every pool made under one is destroyed afterwards,
    the last made first (an upper pool before the pool it spills to), forced."""
    made: list[str] = []
    setting = os.environ.get("KVCACHE_SHM_DIR")

    def new() -> str:
        made.append(f"test-{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield new
    with shm_dir_set_to(setting):
        for name in reversed(made):
            if name in kvcache.list_pools():
                kvcache.destroy(name, force=True)


@pytest.fixture
def make_pool(pool_name: str) -> Iterator[Callable[..., kvcache.Pool]]:
    """``make_pool(size="4M", **create_kwargs)``: create the test's pool; closed afterwards."""
    opened: list[kvcache.Pool] = []

    def make(size: str | int = "4M", **kwargs: object) -> kvcache.Pool:
        pool = kvcache.create(pool_name, size, **kwargs)  # type: ignore[arg-type]
        opened.append(pool)
        return pool

    yield make
    for pool in opened:
        pool.close()


class FakeClock:
    """An injectable wall clock that moves only when told."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on a disk file system, for disk pools: under pytest's ``tmp_path``
    if that is on a disk, else under ``/var/tmp`` or the checkout (removed afterwards)."""
    for parent in (tmp_path, Path("/var/tmp"), Path(__file__).resolve().parent):
        if (
            parent.is_dir()
            and kvcache.segment.tier_of(parent) == "disk"
            and os.access(parent, os.W_OK)
        ):
            folder = Path(tempfile.mkdtemp(prefix="kvcache-disk-", dir=parent))
            yield folder
            shutil.rmtree(folder, ignore_errors=True)
            return
    pytest.fail("no folder on a disk file system to put disk pools in (tmp_path, /var/tmp)")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder ``nobody`` (``other_user.NOBODY``) owns and may write: where another user
    keeps their files, or plants things."""
    folder = Path(tempfile.mkdtemp(prefix="kvcache-trust-"))
    os.chown(folder, NOBODY, NOBODY)
    yield folder
    shutil.rmtree(folder)
