"""contrib/systemd: installed by its script, checked by ``systemd-analyze verify``, and the
commands the units run executed for real (boot, shutdown, a restart, the persist timer)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcache

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "contrib" / "systemd"
INSTALL = UNITS / "install.sh"
CORTEX = shutil.which("cortex", path=str(Path(sys.executable).parent)) or "cortex"
UNIT_FILES = ("kvcache@.service", "kvcache-persist@.service", "kvcache-persist@.timer")
UNIT_FILES += ("kvcache-llama-server@.service",)


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The units as install.sh writes them, under a private root; their folder."""
    result = subprocess.run(
        ["sh", str(INSTALL), "--root", str(tmp_path / "root"), "--cortex", CORTEX],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return tmp_path / "root" / "etc" / "systemd" / "system"


@pytest.fixture
def unit_pool(tmp_path: Path) -> Iterator[str]:
    name = f"unit-{uuid.uuid4().hex[:10]}"
    yield name
    if name in kvcache.list_pools():
        kvcache.destroy(name, force=True)


def test_install_puts_the_cortex_path_in_every_unit(installed: Path) -> None:
    for unit in UNIT_FILES:
        text = (installed / unit).read_text()
        assert "@CORTEX@" not in text
        assert all(line.split("=", 1)[1].startswith(CORTEX) for line in _exec_lines(text))
    assert (installed.parents[1] / "kvcache" / "example.conf").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cortex", "cortex"], "pass --cortex /path/to/cortex"),
        (["--cortex", "/no/such/cortex"], "is not an executable"),
        (["--frobnicate"], "unknown option"),
    ],
)
def test_install_refuses_bad_input_in_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = subprocess.run(
        ["sh", str(INSTALL), "--root", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr


def test_systemd_analyze_verifies_every_unit(installed: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd; CI has it)")
    instances = [str(installed / unit.replace("@.", "@llama.")) for unit in UNIT_FILES]
    result = subprocess.run(
        [analyze, "verify", *instances],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{installed}:"},
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_commands_of_the_units_keep_a_pool_across_a_reboot(
    installed: Path, tmp_path: Path, unit_pool: str
) -> None:
    conf = tmp_path / f"{unit_pool}.conf"
    example = (UNITS / "example.conf").read_text()
    conf.write_text(example.replace("KVCACHE_SIZE=16G", "KVCACHE_SIZE=4M"))
    env = {**_environment(installed / "kvcache@.service", conf), "KVCACHE_HOME": str(tmp_path)}
    boot, shutdown = _commands(installed / "kvcache@.service", unit_pool, env)
    (timer_persist,) = _commands(installed / "kvcache-persist@.service", unit_pool, env)

    _run(boot, env)  # first boot: no snapshot, an empty pool
    with kvcache.open(unit_pool) as pool:
        assert pool.config.size_bytes == 4 << 20 and pool.config.policy == "lru"
        pool.put("prompt", b"kv" * 1000)
    _run(boot, env)  # the service restarted while the pool lives: kept as it is
    with kvcache.open(unit_pool) as pool:
        assert pool.get("prompt") == b"kv" * 1000
    _run(timer_persist, env)
    assert (tmp_path / f"{unit_pool}.kvsnap").is_file()
    with kvcache.open(unit_pool) as pool:
        pool.put("later", b"x")
    _run(shutdown, env)
    kvcache.destroy(unit_pool)  # the reboot: /dev/shm is empty again
    _run(boot, env)
    with kvcache.open(unit_pool) as pool:
        assert pool.get("prompt") == b"kv" * 1000 and pool.get("later") == b"x"


def _exec_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Exec")]


def _environment(unit: Path, conf: Path) -> dict[str, str]:
    """The unit's Environment= words, then the EnvironmentFile's (as systemd reads them)."""
    env = dict(os.environ)
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            key, _, value = line.removeprefix("Environment=").partition("=")
            env[key] = value
    for line in conf.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip("\"'")
    return env


def _commands(unit: Path, name: str, env: dict[str, str]) -> list[list[str]]:
    """The unit's Exec lines for instance ``name``, expanded as systemd does: ``${VAR}`` is one
    word, ``$VAR`` alone splits at whitespace."""
    commands = []
    for line in _exec_lines(unit.read_text()):
        words: list[str] = []
        for word in shlex.split(line.split("=", 1)[1].replace("%i", name)):
            alone = re.fullmatch(r"\$(\w+)", word)
            if alone:
                words.extend(env.get(alone.group(1), "").split())
            else:
                words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
        commands.append(words)
    return commands


def _run(command: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, (command, result.stderr)


def test_the_llama_server_units_command_serves_requests(
    installed: Path, tmp_path: Path, unit_pool: str
) -> None:
    """kvcache-llama-server@.service's command with the example conf (model, pool and port
    ours): a proxy and its llama-server that answer, and stop on SIGTERM with status 0."""
    pytest.importorskip("gguf", reason="gguf is not installed: pip install 'kvcache[llama-cpp]'")
    from kvcache.integrations.gguf_model import write_model
    from kvcache.integrations.llama_server.supervisor import free_port

    model = write_model(tmp_path / "tiny.gguf")
    port = free_port()
    binary = os.environ.get("KVCACHE_LLAMA_SERVER")  # else the one beside the venv's Python
    conf = tmp_path / "llama-server-test.conf"
    conf.write_text(
        (UNITS / "llama-server-example.conf")
        .read_text()
        .replace("KVCACHE_POOL=llama-cache", f"KVCACHE_POOL={unit_pool}")
        .replace("127.0.0.1:8081", f"127.0.0.1:{port}")
        .replace(
            "PROXY_OPTIONS=\n", f"PROXY_OPTIONS={f'--server-bin {binary}' if binary else ''}\n"
        )
        .replace("-m /srv/models/model.gguf -c 8192", f"-m {model} -c 4096")
    )
    unit = installed / "kvcache-llama-server@.service"
    env = {**_environment(unit, conf), "KVCACHE_HOME": str(tmp_path)}
    (command,) = _commands(unit, "test", env)
    kvcache.create(unit_pool, "64M").close()
    log = tmp_path / "unit.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            answers = [_post(url, "/completion", {"prompt": "the cache", "n_predict": 4})]
            answers.append(
                _post(
                    url,
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                )
            )
        finally:
            process.terminate()
            code = process.wait(60)
    assert code == 0, log.read_text()[-2000:]
    assert all(status == 200 for status, _ in answers), answers
    assert "listening on" in log.read_text()


def _post(url: str, path: str, doc: dict[str, object]) -> tuple[int, bytes]:
    """POST ``doc`` once the proxy at ``url`` answers (it listens once its server is ready)."""
    deadline = time.monotonic() + 120
    while True:
        request = urllib.request.Request(url + path, json.dumps(doc).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
