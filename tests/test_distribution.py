"""The package as PyPI would get it: the sdist and the wheel build (the wheel from the
sdist, so a file the sdist lacks fails here), their metadata passes ``twine check``, and
the wheel installed alone in a clean venv (no extras, no checkout on the path) gives
working ``kvcache`` and ``cortex`` commands and a library."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("build", reason="the dev extra brings build")


def _run(*command: str | Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    result = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel built from it, as ``python -m build`` makes them."""
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: build with this venv's setuptools (the dev extra's), no download
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    built = {path.suffix: path for path in out.iterdir()}
    return {"sdist": built[".gz"], "wheel": built[".whl"]}


def test_twine_finds_the_metadata_complete(dist: dict[str, Path]) -> None:
    pytest.importorskip("twine", reason="the dev extra brings twine")
    report = _run(sys.executable, "-m", "twine", "check", "--strict", *dist.values())
    assert report.count("PASSED") == 2, report


def test_the_wheel_carries_its_license_types_schemas_and_commands(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        meta = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt")))
    assert "kvcache/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert any(name.endswith("licenses/src/kvcache/_native/LICENSE.xxhash") for name in names)
    for module in ("_copysum", "_lookup"):
        assert any(name.startswith(f"kvcache/{module}.") and name.endswith(".so") for name in names)
    assert {"kvcache/schemas/status.json", "kvcache/schemas/metrics.json"} <= set(names)
    assert "License-Expression: Apache-2.0" in meta
    assert "Description-Content-Type: text/markdown" in meta
    urls = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Project-URL")]
    assert {url.split(",")[0] for url in urls} == {"Homepage", "Documentation", "Source", "Issues"}
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist")]
    assert "Requires-Dist: rich>=13" in requires  # the command line works without extras
    assert 'Requires-Dist: redis[hiredis]>=5.0; extra == "redis"' in requires
    assert b"kvcache = kvcache.cli:main" in entry_points
    assert b"cortex = kvcache.cli:cortex" in entry_points


def test_the_sdist_holds_what_a_rebuild_needs(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.partition("/")[2] for name in sdist.getnames()}
    assert {"LICENSE", "README.md", "pyproject.toml", "src/kvcache/py.typed"} <= names
    assert {
        "src/kvcache/_native/copysum.c",
        "src/kvcache/_native/lookup.c",
        "src/kvcache/_native/put.c",
        "src/kvcache/_native/rank.c",
        "src/kvcache/_native/copybytes.h",
        "src/kvcache/_native/sumcopy.h",
        "src/kvcache/_native/xxhash.h",
    } <= names


@pytest.fixture(scope="module")
def clean_venv(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv of its own (no system site-packages) with the wheel and nothing else asked."""
    venv = tmp_path_factory.mktemp("venv") / "plain"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         dist["wheel"], env=_plain_env())  # fmt: skip
    return venv


def _plain_env() -> dict[str, str]:
    """This environment without the checkout on ``PYTHONPATH``."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.fixture
def name() -> Iterator[str]:
    made = f"wheel-{uuid.uuid4().hex[:10]}"
    yield made
    import kvcache

    if made in kvcache.list_pools():
        kvcache.destroy(made, force=True)


def test_a_plain_install_runs_the_life_cycle(clean_venv: Path, name: str) -> None:
    env, bin_ = _plain_env(), clean_venv / "bin"
    where = _run(bin_ / "python", "-c", "import kvcache; print(kvcache.__file__)", env=env)
    assert where.startswith(str(clean_venv)), where  # the wheel's, not this checkout's
    engine = _run(bin_ / "python", "-c", "from kvcache import native; print(native.engine())")
    assert engine.strip() == "compiled"  # the wheel carries the extension it built
    assert "created pool" in _run(bin_ / "kvcache", "create", name, "--size", "8M", env=env)
    store = f"import kvcache\nwith kvcache.open({name!r}) as pool: pool.put('prompt', b'kv')"
    _run(bin_ / "python", "-c", store, env=env)
    assert '"num_entries": 1' in _run(bin_ / "kvcache", "status", name, "--json", env=env)
    assert name in _run(bin_ / "kvcache", "list", env=env)
    assert name in _run(bin_ / "cortex", "cache", "list", env=env)
    _run(bin_ / "kvcache", "destroy", name, "--yes", env=env)
    assert name not in _run(bin_ / "kvcache", "list", env=env)
