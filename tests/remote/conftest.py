"""Fixtures for the remote-tier tests: real redis-server processes (see servers.py).

Each test gets its own standalone server (one starts in about 15 ms), so a test may stop,
kill, restart or reconfigure it freely. A Cluster takes 2 to 4 s to create (``redis-cli
--cluster create`` waits in whole seconds for the nodes to join), so ``redis_cluster`` is
one Cluster shared by the session and emptied before each test; a test that stops, kills,
restarts or reconfigures a node takes ``fresh_redis_cluster``, its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import pytest
from servers import Cluster, Server, random_password


@pytest.fixture(params=["redis-server", "valkey-server"], ids=["redis", "valkey"])
def redis_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """A standalone server on 127.0.0.1 at a free port: every test that takes it runs against
    Redis and against Valkey (the same protocol; kvcache must not care which)."""
    with closing(Server(program=request.param)) as server:
        yield server


@pytest.fixture
def redis_unix() -> Iterator[Server]:
    """A standalone server listening only on a unix socket (mode 0700)."""
    with closing(Server(unix_socket=True)) as server:
        yield server


@pytest.fixture
def redis_tls() -> Iterator[Server]:
    """A standalone server that speaks only TLS (``.ca_file`` is its self-signed CA)."""
    with closing(Server(tls=True)) as server:
        yield server


@pytest.fixture
def redis_password() -> Iterator[Server]:
    """A standalone server that requires ``.password`` (its ``.url`` does not carry it)."""
    with closing(Server(password=random_password())) as server:
        yield server


@pytest.fixture(scope="session")
def _shared_clusters() -> Iterator[list[Cluster]]:
    """Holds the session's shared Cluster once a test asked for it (made lazily)."""
    clusters: list[Cluster] = []
    yield clusters
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def redis_cluster(_shared_clusters: list[Cluster]) -> Iterator[Cluster]:
    """The session's 3-master Cluster, empty; the test must leave its nodes alone."""
    if not _shared_clusters:
        _shared_clusters.append(Cluster())
    cluster = _shared_clusters[0]
    cluster.flush()
    yield cluster
    if not cluster.pristine:
        # replaced, so that later tests do not fail for this one
        _shared_clusters.pop().close()
        pytest.fail(
            "the test stopped, killed, restarted or reconfigured a node of the shared "
            "redis_cluster; a test that does so takes fresh_redis_cluster",
            pytrace=False,
        )


@pytest.fixture
def fresh_redis_cluster() -> Iterator[Cluster]:
    """A 3-master Cluster of the test's own (2 to 4 s to create), for node faults."""
    with closing(Cluster()) as cluster:
        yield cluster
