"""The Redis fixtures are real servers and their faults are real: checked with redis-py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from servers import Cluster, Server

HERE = Path(__file__).resolve().parent


def test_a_standalone_server_stores_and_persists_nothing(redis_server: Server) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    with redis_server.client() as client:
        client.set("greeting", b"hello")
        assert client.get("greeting") == b"hello"
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
    assert redis_server.cli("GET", "greeting") == "hello\n"


def test_the_server_is_the_one_asked_for(redis_server: Server) -> None:
    """The valkey runs are not Redis under another name."""
    with redis_server.client() as client:
        info = client.info("server")
    assert ("valkey_version" in info) == (redis_server.program == "valkey-server")


def test_config_set_changes_the_running_server(redis_server: Server) -> None:
    redis_server.config_set("maxmemory", "1mb")
    assert redis_server.cli("CONFIG", "GET", "maxmemory").split() == ["maxmemory", "1048576"]
    assert not redis_server.pristine


def test_the_unix_server_listens_only_on_a_private_socket(redis_unix: Server) -> None:
    assert redis_unix.socket_path is not None
    assert redis_unix.url == f"unix://{redis_unix.socket_path}?db=0"
    assert stat.S_IMODE(redis_unix.socket_path.stat().st_mode) == 0o700
    with redis_unix.client() as client:
        client.set("k", b"v")
        assert client.get("k") == b"v"
        assert client.config_get("port") == {"port": "0"}


def test_the_password_server_refuses_clients_without_it(redis_password: Server) -> None:
    password = redis_password.password
    assert password and password not in redis_password.url
    # in the config file, not on the command line, where ps would show it
    assert password.encode() not in Path(f"/proc/{redis_password.pid}/cmdline").read_bytes()
    for wrong in (None, "wrong" + password):
        with (
            redis.Redis.from_url(redis_password.url, password=wrong) as client,
            pytest.raises(redis.AuthenticationError),
        ):
            client.get("k")
    with redis_password.client() as client:
        client.set("k", b"v")
        assert client.get("k") == b"v"
    assert redis_password.cli("GET", "k") == "v\n"


def test_stop_makes_a_client_time_out_and_resume_recovers(redis_server: Server) -> None:
    with redis_server.client(socket_timeout=0.2) as client:
        client.set("k", b"v")
        redis_server.stop()
        with pytest.raises(redis.TimeoutError):
            client.get("k")
        redis_server.resume()
        assert client.get("k") == b"v"


def test_kill_and_restart_bring_an_empty_server_back_on_the_same_port(
    redis_server: Server,
) -> None:
    port, pid = redis_server.port, redis_server.pid
    with redis_server.client(socket_timeout=1.0) as client:
        client.set("k", b"v")
        redis_server.kill()
        with pytest.raises(redis.ConnectionError):
            client.get("k")
        redis_server.restart()
        assert (redis_server.port, redis_server.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert redis_server.pid != pid
        assert client.ping()
        assert client.get("k") is None  # nothing was persisted


def test_closing_a_stopped_server_leaves_no_process_or_folder() -> None:
    server = Server()
    pid, folder = server.pid, server.folder
    server.stop()
    server.close()
    assert not folder.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_dies_with_the_process_that_started_it() -> None:
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from servers import Server; s = Server(); "
            "print(s.pid, s.folder, flush=True); time.sleep(60)",
        ],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        pid, folder = starter.stdout.readline().split()
    finally:
        starter.kill()
        starter.wait()
    shutil.rmtree(folder, ignore_errors=True)  # the dead starter could not remove it
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"redis-server {pid} outlived the process that ran it"
        time.sleep(0.01)


def test_a_missing_redis_server_fails_and_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=r"redis-server is not on PATH.*apt-get inst"):
        Server()


def test_the_cluster_spreads_keys_over_every_master(redis_cluster: Cluster) -> None:
    ports = ",".join(f"127.0.0.1:{node.port}" for node in redis_cluster.nodes)
    assert redis_cluster.url == f"redis+cluster://{ports}"
    keys = [f"key-{i}" for i in range(30)]
    with redis_cluster.client() as client:
        assert len({client.keyslot(key) for key in keys}) == len(keys)
        for key in keys:
            client.set(key, key.encode())
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
    for node in redis_cluster.nodes:
        with node.client() as client:
            assert client.dbsize() > 0


def test_the_cluster_reads_keys_sharing_a_hash_tag_in_one_mget(redis_cluster: Cluster) -> None:
    parts = [f"{{prefix-7}}:part-{i}" for i in range(4)]
    with redis_cluster.client() as client:
        assert len({client.keyslot(part) for part in parts}) == 1
        client.mset({part: part.encode() for part in parts})
        assert client.mget(parts) == [part.encode() for part in parts]


def test_the_shared_cluster_is_empty_for_each_test(redis_cluster: Cluster) -> None:
    # the two tests above wrote keys to it
    with redis_cluster.client() as client:
        assert client.dbsize() == 0


def test_a_killed_cluster_node_restarts_with_its_slots(fresh_redis_cluster: Cluster) -> None:
    node = fresh_redis_cluster.nodes[0]
    with fresh_redis_cluster.client() as client:
        key = next(k for k in (f"key-{i}" for i in range(100)) if _owner(client, k) == node.port)
        client.set(key, b"v")
        node.kill()
        node.restart()
        fresh_redis_cluster.wait_until_ok()
        assert client.get(key) is None  # the node came back empty, owning the same slots
        client.set(key, b"again")
        assert client.get(key) == b"again"
        assert _owner(client, key) == node.port


def _owner(client: redis.RedisCluster, key: str) -> int:
    """The port of the master that holds ``key``'s slot."""
    return client.get_node_from_key(key).port
