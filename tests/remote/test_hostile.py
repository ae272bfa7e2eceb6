"""A remote that lies: forged records, planted heads, keys of other types, a server that
drips its reply, a service on the port that is not Redis. Each is a miss for the key it
touches (counted), never an exception, never a hang, never the tier down for other keys.

The ``HANG_GUARD_S`` bounds are not timing assertions: the deadlines in play are a
fraction of a second, and a call that took the guard's time would have hung."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvcache
from kvcache import transfer
from kvcache.errors import RemoteError
from kvcache.keys import encode_key
from kvcache.layout import KEY_IS_STR
from kvcache.remote import RemoteLink, RemoteSpec, records
from kvcache.stored import StoredEntry

NS = "hostile"
HANG_GUARD_S = 5.0
VALUE = b"the KV of an honest host" * 100


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "remote.key"
    path.write_text("5f" * 32 + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def pools(names, redis_server) -> Iterator:
    made: list[kvcache.Pool] = []

    def make(**options: object) -> kvcache.Pool:
        options.setdefault("remote_timeout", "200ms")
        pool = kvcache.create(names(), "4M", remote=redis_server.url, namespace=NS, **options)  # type: ignore[arg-type]
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def forge(server, key: str, value: bytes, mac_key: bytes | None = None, **head: int) -> None:
    """Write a record for ``key`` as an attacker with write access to the namespace would:
    a correct checksum, and the head fields given changed (after the sum)."""
    raw = encode_key(key)[0]
    flags = KEY_IS_STR
    checksum = transfer.checksum([raw, b"", value], flags, len(raw), 0, len(value))
    entry = StoredEntry(raw, flags, 0, len(value), 0, math.inf, checksum)
    part = bytearray(records.encode(entry, [raw, b"", value], 1 << 20, mac_key).parts[0])
    for offset, number in head.items():
        part[int(offset.removeprefix("at_")) : int(offset.removeprefix("at_")) + 4] = (
            number.to_bytes(4, "little")
        )
    server.client().set(records.key_name(NS, raw), bytes(part))


def test_without_a_key_a_forged_record_is_served_which_the_docs_say(pools, redis_server):
    """The threat a key removes: anyone who may write the namespace decides what is read."""
    reader = pools()
    forge(redis_server, "prompt", b"the forger's KV")
    assert reader.get("prompt") == b"the forger's KV"


def test_bug_a_forged_record_with_a_recomputed_checksum_was_served(pools, redis_server, key_file):
    writer = pools(remote_key_file=key_file, write_through=True)
    reader = pools(remote_key_file=key_file)
    writer.put("honest", VALUE)
    writer.remote.flush()
    assert reader.get("honest") == VALUE  # control: a signed record is served
    forge(redis_server, "prompt", b"the forger's KV")  # unsigned, checksum right
    forge(redis_server, "other", b"the forger's KV", mac_key=b"guessed-key-0123456789")
    assert reader.get("prompt") is None and reader.get("other") is None
    stats = reader.remote_stats()
    assert stats.rejected == 2 and stats.up
    # rejected records are not ours to delete: they stay (an unkeyed host may read them)
    assert redis_server.client().exists(records.key_name(NS, encode_key("prompt")[0]))


def test_a_record_signed_under_another_key_is_rejected_not_promoted(
    pools, redis_server, key_file, tmp_path
):
    other_key = tmp_path / "other.key"
    other_key.write_text("a0" * 32)
    other_key.chmod(0o600)
    writer = pools(remote_key_file=other_key, write_through=True)
    reader = pools(remote_key_file=key_file)
    writer.put("k", VALUE)
    writer.remote.flush()
    assert reader.get("k") is None
    assert reader.remote_stats().rejected == 1 and "k" not in list(reader.keys())  # not promoted


def test_bug_a_head_claiming_a_million_parts_made_a_million_gets(pools, redis_server):
    reader = pools()
    forge(redis_server, "k", b"v" * 100, at_24=1 << 20)  # the head's part count
    before = _gets(redis_server)
    started = time.monotonic()
    assert reader.get("k") is None
    assert time.monotonic() - started < HANG_GUARD_S
    assert _gets(redis_server) - before <= 2  # the head, and no part asked for
    assert reader.remote_stats().up


def test_bug_a_key_of_another_type_took_the_tier_down_for_every_key(pools, redis_server):
    writer, reader = pools(write_through=True), pools()
    writer.put("good", VALUE)
    writer.remote.flush()
    redis_server.client().hset(records.key_name(NS, encode_key("bad")[0]), "f", "v")
    assert reader.get("bad") is None
    stats = reader.remote_stats()
    assert stats.up and stats.errors == 0 and stats.rejected == 1
    assert reader.get("good") == VALUE  # the tier stayed up for the other key


class _Liar:
    """A TCP service on 127.0.0.1 that answers every request with ``reply``, sent
    ``drip_s`` apart a byte at a time if given: what a wrong or hostile server does."""

    def __init__(self, reply: bytes, drip_s: float = 0.0) -> None:
        self.reply, self.drip_s = reply, drip_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.stopping = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self.stopping and conn.recv(65536):
                    if not self.drip_s:
                        conn.sendall(self.reply)
                        continue
                    for byte in self.reply:
                        conn.sendall(bytes([byte]))
                        time.sleep(self.drip_s)
            except OSError:
                return

    def close(self) -> None:
        self.stopping = True
        self.listener.close()


@pytest.fixture
def liar() -> Iterator[type[_Liar]]:
    made: list[_Liar] = []

    def make(reply: bytes, drip_s: float = 0.0) -> _Liar:
        made.append(_Liar(reply, drip_s))
        return made[-1]

    yield make  # type: ignore[misc]
    for server in made:
        server.close()


def test_bug_a_service_answering_ok_to_everything_raised_attribute_error(names, liar):
    service, name = liar(b"+OK\r\n"), names()
    with pytest.raises(RemoteError, match="not a Redis"):
        kvcache.create(name, "4M", remote=service.url, namespace=NS)
    assert name not in kvcache.list_pools()
    with kvcache.create(name, "4M") as pool:  # a server that became a liar after create
        link = _link_to(pool, service.url)
        pool.put("local", b"v")
        assert pool.get("k") is None and "k" not in pool and pool.get("local") == b"v"
        assert link.problem is not None  # down, said once, never raised


def test_bug_a_get_answered_with_an_integer_raised_type_error(names, liar):
    service = liar(b":1\r\n")
    with kvcache.create(names(), "4M") as pool:
        _link_to(pool, service.url)
        assert pool.get("k") is None
        assert "k" not in pool


def test_bug_a_server_that_drips_its_reply_held_a_get_for_seconds(names, liar):
    # a GET reply of 60 bytes at 0.1 s a byte: 6 s, each read well inside the timeout
    service = liar(b"$50\r\n" + b"x" * 50 + b"\r\n", drip_s=0.1)
    with kvcache.create(names(), "4M") as pool:
        link = _link_to(pool, service.url, timeout_s=0.3)
        started = time.monotonic()
        assert pool.get("k") is None
        assert time.monotonic() - started < 2.0  # the deadline (0.3 s), not the drip (6 s)
        assert link.problem is not None and "Timeout" in link.problem


def _link_to(pool: kvcache.Pool, url: str, timeout_s: float = 0.25) -> RemoteLink:
    """Give ``pool`` a remote tier at ``url``, as its owner's settings would (a server that
    changed after the pool was made: create checks the one it is given)."""
    link = RemoteLink(
        RemoteSpec(url, NS, timeout_s=timeout_s), lambda d: None, max_entry_bytes=1 << 22
    )
    pool.attach_remote(link, top=True, bottom=True)
    return link


def _gets(server) -> int:
    """How many GETs the server has answered (its own count)."""
    stats = server.client().info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


def test_the_deadline_watchdog_cuts_a_late_call_and_its_thread_ends_when_idle(monkeypatch):
    from kvcache.remote.deadlines import Watchdog

    monkeypatch.setattr("kvcache.remote.deadlines.IDLE_EXIT_S", 0.05)
    watchdog, cut = Watchdog("test-deadlines"), threading.Event()
    with watchdog.deadline(0.05, cut.set):
        assert cut.wait(HANG_GUARD_S)  # a call still running past its deadline is cut
    with watchdog.deadline(HANG_GUARD_S, cut.clear):
        pass  # one that ends in time is not
    assert cut.is_set()
    started = time.monotonic()
    while watchdog._thread is not None and time.monotonic() - started < HANG_GUARD_S:
        time.sleep(0.01)
    assert watchdog._thread is None  # no thread left behind by an idle link
