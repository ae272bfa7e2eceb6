"""``cortex cache create --remote ...`` and ``status`` of a pool with a remote, run as the
real console script against a real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import kvcache
from json_schemas import check
from test_cli import CORTEX, cortex, cortex_json
from test_cli_narrow import on_terminal


def test_create_with_a_remote_then_status_shows_it_up_with_its_counters(names, redis_server):
    name = names()
    doc = cortex_json(
        "create",
        name,
        "--size",
        "4M",
        "--remote",
        redis_server.url,
        "--namespace",
        "team-a",
        "--write-through",
        "--remote-timeout",
        "100ms",
    )
    assert doc["created"]["name"] == name
    with kvcache.open(name) as pool:
        pool.put("k", b"v")
        pool.remote.flush()
    status = cortex_json("status", name)
    check("status", status)
    remote = status["remote"]
    assert (remote["url"], remote["namespace"], remote["write_through"]) == (
        redis_server.url,
        "team-a",
        True,
    )
    assert remote["up"] and remote["ping_s"] > 0 and remote["writes"] == 1
    human = cortex("status", name)
    assert human.returncode == 0
    assert "REMOTE" in human.stdout and "up (ping" in human.stdout
    assert "every put (write-through)" in human.stdout


def create_with_remote(name: str, url: str) -> None:
    """``cortex cache create NAME --remote URL`` with a short timeout, for tests that stop it."""
    cortex_json(
        "create", name, "--size", "4M", "--remote", url, "--namespace", "n",
        "--remote-timeout", "100ms",
    )  # fmt: skip


def test_status_says_down_and_why_when_redis_is_stopped(names, redis_server):
    name = names()
    create_with_remote(name, redis_server.url)
    redis_server.stop()
    try:
        doc = cortex_json("status", name)
        check("status", doc)
        assert doc["remote"]["up"] is False and "Timeout" in doc["remote"]["problem"]
        human = cortex("status", name)
        assert human.returncode == 0 and "down: " in human.stdout
    finally:
        redis_server.resume()


@pytest.mark.parametrize("columns", [80, 60])
def test_status_of_a_down_remote_on_a_narrow_terminal_shows_the_whole_problem(
    names, redis_server, columns
):
    name = names()
    cortex_json("create", name, "--size", "4M", "--remote", redis_server.url,
                "--namespace", "n", "--remote-timeout", "100ms")  # fmt: skip
    redis_server.stop()
    try:
        problem = cortex_json("status", name)["remote"]["problem"]
        code, lines = on_terminal([CORTEX, "cache", "status", name], columns=columns)
    finally:
        redis_server.resume()
    assert code == 0 and not any("…" in line for line in lines), lines
    start = next(i for i, line in enumerate(lines) if line.startswith("state "))
    value_column = lines[start].index("down: ")
    state = [lines[start][value_column:].strip()] + [
        line.strip() for line in lines[start + 1 :] if line[:value_column].strip() == ""
    ]
    assert f"down: {problem}" in " ".join(state), lines


LOOKING = ["status {name}", "status", "list", "stats {name}", "entries {name}", "metrics"]


@pytest.mark.parametrize("state", ["up", "stopped", "killed"])
def test_bug_looking_at_a_pool_with_a_remote_wrote_to_it(names, redis_server, state):
    """status pinged the remote and counted the ping (or, down, an error) in the pool's file:
    an operator checking during an outage inflated the alert being watched."""
    name = names()
    create_with_remote(name, redis_server.url)
    with kvcache.open(name) as pool:
        pool.put("k", b"v" * 5000)
        pool.remote.flush()
        path = pool.path
    before = path.read_bytes()
    {"up": lambda: None, "stopped": redis_server.stop, "killed": redis_server.kill}[state]()
    try:
        for command in LOOKING:
            result = cortex(*command.format(name=name).split())
            assert result.returncode == 0 and result.stdout, result.stderr
            assert path.read_bytes() == before, command
        remote = cortex_json("status", name)["remote"]
        assert remote["up"] is (state == "up") and remote["errors"] == 0
    finally:
        if state == "stopped":
            redis_server.resume()
    with kvcache.open(name) as pool:  # the control: a worker's call is counted, in the file
        pool.get("absent")
    assert path.read_bytes() != before


def test_a_password_file_from_the_command_line(names, redis_password, tmp_path):
    secret = tmp_path / "pass"
    secret.write_text(redis_password.password)
    secret.chmod(0o600)
    name = names()
    cortex_json(
        "create",
        name,
        "--size",
        "4M",
        "--remote",
        redis_password.url,
        "--namespace",
        "n",
        "--password-file",
        str(secret),
    )
    assert cortex_json("status", name)["remote"]["up"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--remote", "http://x:1", "--namespace", "n"], "is not one of redis://"),
        (["--remote", "redis://:pw@127.0.0.1:1", "--namespace", "n"], "holds a password"),
        (["--remote", "{url}"], "needs --namespace"),
        (["--namespace", "n"], "need --remote"),
        (["--remote", "{url}", "--namespace", "n", "--remote-timeout", "soon"], "timeout"),
        (
            ["--remote", "{url}", "--namespace", "n", "--password-file", "/no/such"],
            "No such file",
        ),
        (["--remote", "{url}", "--namespace", "n!"], "namespace"),
        (["--remote", "{dead}", "--namespace", "n"], "cannot reach remote"),
        (["--remote", "{locked}", "--namespace", "n"], "refused the credentials"),
    ],
)
def test_bad_remote_options_are_one_line_exit_1_and_make_no_pool(
    names, redis_server, redis_password, args, says
):
    dead = f"redis://127.0.0.1:{redis_server.port}/0"
    url = redis_server.url
    if "{dead}" in args:
        redis_server.kill()
    name = names()
    argv = [a.format(url=url, dead=dead, locked=redis_password.url) for a in args]
    result = cortex("create", name, "--size", "4M", *argv)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr
    assert name not in kvcache.list_pools()


def test_the_password_never_appears_in_status(names, redis_password, monkeypatch):
    monkeypatch.setenv("KVCACHE_REDIS_PASSWORD", redis_password.password)
    name = names()
    cortex_json("create", name, "--size", "4M", "--remote", redis_password.url, "--namespace", "n")
    for args in (["status", name], ["status", name, "--json"], ["list", "--json"]):
        result = cortex(*args)
        assert result.returncode == 0 and redis_password.password not in result.stdout
    assert json.loads(cortex("status", name, "--json").stdout)["remote"]["up"]


def test_create_help_lists_the_remote_options():
    out = subprocess.run(
        [sys.executable, "-m", "kvcache", "create", "--help"], capture_output=True, text=True
    ).stdout
    for option in (
        "--remote",
        "--namespace",
        "--write-through",
        "--remote-timeout",
        "--password-file",
    ):
        assert option in out
