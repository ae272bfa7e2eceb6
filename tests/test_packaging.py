"""What users install: py.typed for their type checkers, and a library that needs no extras
(tests/test_distribution.py builds the wheel and installs it in a clean venv)."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import kvcache

SOURCE = Path(kvcache.__file__).resolve().parents[1]
"""The folder the kvcache under test is imported from (src/ of this checkout, or site-packages)."""
CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"
KVCACHE = shutil.which("kvcache", path=str(Path(sys.executable).parent)) or "kvcache"
EXTRAS_ONLY = {
    "kvcache.__main__": "runs the command line on import",
    "kvcache.cli.bars": "rich",
    "kvcache.cli.terminal": "rich",
    "kvcache.integrations.devices": "torch",
    "kvcache.integrations.llama_cpp": "llama-cpp-python",
    "kvcache.integrations.transformers": "torch, transformers",
    "kvcache.integrations.vllm": "vllm (and its submodules, which the package imports first)",
    "kvcache.metrics": "prometheus_client",
}
"""Modules that may need an extra (or are not for importing); every other one must not."""
_PROXY_MODULES = "app exchange forward identity proxy slotfile slots store supervisor upstream"
EXTRAS_ONLY.update(
    (f"kvcache.integrations.llama_server{module}", "aiohttp")
    for module in ["", *(f".{name}" for name in _PROXY_MODULES.split())]
)


def test_the_package_marks_itself_typed() -> None:
    assert importlib.resources.files("kvcache").joinpath("py.typed").is_file()


def test_a_users_type_checker_sees_the_packages_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the dev extra")
    user = tmp_path / "user.py"
    user.write_text(
        textwrap.dedent(
            """
            import kvcache

            pool = kvcache.open("llama-cache")
            reveal_type(pool.get("prompt-42"))
            pool.put(42, b"kv")
            kvcache.opne("llama-cache")
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, str(user)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SOURCE)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    # without py.typed mypy skips the package: Any, and no error for the int key
    assert 'Revealed type is "bytes | numpy.ndarray' in result.stdout, result.stdout
    assert 'Argument 1 to "put" of "Pool" has incompatible type "int"' in result.stdout
    # the names imported on first use are still known to type checkers, and only they
    assert 'Module has no attribute "opne"' in result.stdout


BLOCKER = """
import sys

class _NotInstalled:
    '''Makes {blocked} look uninstalled: every import of them fails as a missing module does.'''

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

USE_THE_LIBRARY = """
import importlib, json, pkgutil, sys
import numpy as np
import kvcache
from kvcache import KVLayout, PrefixCache

name, snapshot, extras_only = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
extras = ("redis", "rich", "torch", "transformers", "llama_cpp", "gguf", "prometheus_client",
          "aiohttp")
failed = {}
for module in pkgutil.walk_packages(kvcache.__path__, "kvcache."):
    if module.name not in extras_only:
        try:
            importlib.import_module(module.name)
        except ImportError as exc:
            failed[module.name] = str(exc)

pool = kvcache.create(name, "4M", page_size="4K")
pool.put("bytes", b"kv")
pool["array"] = np.arange(12, dtype=np.float16).reshape(3, 4)
cache = PrefixCache(pool, "model", KVLayout(2, 1, 4, "float16"), chunk_tokens=4)
cache.store(list(range(8)), np.ones((2, 2, 1, 8, 4), np.float16))
path = kvcache.persist(pool, snapshot)
pool.close()
kvcache.destroy(name)
restored = kvcache.restore(name, path)
prefix = PrefixCache(restored, "model", KVLayout(2, 1, 4, "float16"), chunk_tokens=4)
print(json.dumps({
    "failed": failed,
    "bytes": restored.get("bytes").decode(),
    "array": restored["array"].tolist(),
    "prefix_tokens": prefix.lookup(list(range(8))),
    "loaded": sorted({m.partition(".")[0] for m in sys.modules} & set(extras)),
}))
restored.close()
kvcache.destroy(name)
"""


def _without(blocked: set[str], tmp_path: Path, *command: str) -> subprocess.CompletedProcess:
    """Run ``command`` where importing any of ``blocked`` fails (installed by sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    return subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{SOURCE}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_library_works_without_rich_torch_transformers_or_redis(tmp_path: Path) -> None:
    name = f"test-{uuid.uuid4().hex[:12]}"
    try:
        result = _without(
            {"redis", "rich", "torch", "transformers", "prometheus_client", "aiohttp"},
            tmp_path,
            sys.executable,
            "-c",
            USE_THE_LIBRARY,
            name,
            str(tmp_path / "pool.kvsnap"),
            json.dumps(sorted(EXTRAS_ONLY)),
        )
    finally:
        if name in kvcache.list_pools():
            kvcache.destroy(name)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {
        "failed": {},
        "bytes": "kv",
        "array": [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]],
        "prefix_tokens": 8,
        "loaded": [],
    }


LOAD_THE_CORE_AND_THE_COMMAND_LINE = """
import importlib.util, json, sys
import kvcache, kvcache.cli, kvcache.cli.commands, kvcache.cli.output
print(json.dumps({"installed": importlib.util.find_spec("redis") is not None,
                  "loaded": "redis" in sys.modules}))
"""


def test_importing_the_library_and_its_command_line_leaves_redis_unloaded() -> None:
    # redis installed (the test extra brings it) and not blocked: only lazy imports keep it out
    result = subprocess.run(
        [sys.executable, "-c", LOAD_THE_CORE_AND_THE_COMMAND_LINE],
        env={**os.environ, "PYTHONPATH": str(SOURCE)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == {"installed": True, "loaded": False}


def test_the_blocker_really_blocks(tmp_path: Path) -> None:
    result = _without({"rich"}, tmp_path, sys.executable, "-c", "import kvcache.cli.terminal")
    assert result.returncode != 0 and "No module named 'rich" in result.stderr


@pytest.mark.parametrize(
    "command",
    [[KVCACHE, "list"], [CORTEX, "cache", "list"], [sys.executable, "-m", "kvcache", "list"]],
    ids=["kvcache", "cortex", "python -m kvcache"],
)
def test_the_command_line_without_rich_says_what_to_install(tmp_path: Path, command) -> None:
    result = _without({"rich"}, tmp_path, *command)
    assert result.returncode == 1
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "error:" in result.stderr and "pip install 'rich>=13'" in result.stderr


def test_metrics_without_prometheus_client_says_what_to_install(tmp_path: Path) -> None:
    result = _without({"prometheus_client"}, tmp_path, CORTEX, "cache", "metrics")
    assert (result.returncode, result.stdout) == (1, "")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "pip install 'kvcache[metrics]'" in result.stderr
