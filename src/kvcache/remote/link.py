"""The remote tier at run time: bounded calls, marked down on failure, and a writer thread.

Every call to Redis is made through ``RemoteLink.call``, with a deadline for
the whole call (``deadlines``): the spec's timeout, plus time for the bytes a
read knows it asks for at ``MIN_RATE_BYTES_S``. A failure of any kind (refused,
timed out, an error answer such as OOM or LOADING, a dropped connection, a
service on the port that is not Redis) is logged once as a warning, counted,
and marks the remote *down*; while it is down every call returns its default
at once (a miss, "not there", "not written"), and it is tried again after a
backoff that doubles from ``FIRST_BACKOFF_S`` up to ``MAX_BACKOFF_S``. A reply
that is wrong for one key only (a key of another type, ``WRONGTYPE``; a record
that fails the pool's MAC) is a miss for that key, counted as *rejected*, and
the tier stays up. A caller never sees an exception from the remote and never
waits past the deadline for it.

Writes (entries demoted or written through, and deletes) never wait for the
network: they are queued and a daemon thread sends them, in order, in
pipelined batches. The queue holds at most ``MAX_PENDING_BYTES`` of values;
what does not fit is dropped and counted (the remote is a cache). At exit the
thread gets ``EXIT_FLUSH_S`` to send what is queued.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import KVCacheError
from . import records
from .deadlines import Watchdog
from .urls import RemoteSpec, connect

T = TypeVar("T")
log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
MAX_PENDING_BYTES = 256 << 20
EXIT_FLUSH_S = 2.0
BATCH_BYTES = 8 << 20
"""A writer's pipeline is sent once it holds this much (or the queue is empty)."""
MIN_RATE_BYTES_S = 100 << 20
"""A read of parts whose sizes a head declared may take this long per byte beyond the
timeout (a 64 MiB part: 0.64 s more), so a big value is not cut off on a slow LAN."""
SETTLE_S = 0.25
"""Counts are added up in the process and written to the pool's header at most this often
(and at every flush and ``Pool.remote_stats``): writing them per call took the pool's lock
twice per batch, in the writer thread, against the caller's puts (-26% on a 4 KiB
write-through put, measured)."""

Counter = Callable[[dict[str, int]], None]
"""Adds to the remote counters of the pool that names the remote (``layout.REMOTE_COUNTERS``)."""


@dataclass(frozen=True)
class _Put:
    name: str
    encoded: records.Encoded
    expires_at: float


@dataclass(frozen=True)
class _Delete:
    name: str


class RemoteLink:
    """One process's connection to a pool's remote tier (shared by the pools of its chain)."""

    def __init__(
        self,
        spec: RemoteSpec,
        count: Counter,
        *,
        max_entry_bytes: int,
        part_bytes: int | None = None,
    ) -> None:
        """
        Args:
            spec: where the remote is and how to reach it.
            count: adds to the counters of the pool that names the remote.
            max_entry_bytes: the most bytes a record may declare (what the pool
                could store): a head that claims more is not read further.
            part_bytes: the size of a record's parts (tests make it small).
        """
        self.spec = spec
        self.max_entry_bytes = max_entry_bytes
        self.part_bytes = part_bytes or records.DEFAULT_PART_BYTES
        self._mac_key: bytes | None = None
        self._key_loaded = False
        self._watchdog = Watchdog("kvcache-remote-deadlines")
        # clients a deadline cut, and why: every call that then fails on one (the late
        # call, and calls of other threads sharing its sockets) reports the timeout
        self._cut_why: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._to_header = count
        self._counts: dict[str, int] = {}
        self._counts_lock = threading.Lock()
        self._settle_at = 0.0
        self._client: Any = None
        self._guard = threading.Lock()  # down state and the client
        self._retry_at = 0.0
        self._backoff = FIRST_BACKOFF_S
        self.problem: str | None = None  # why it is down, for status
        self._queue: deque[_Put | _Delete] = deque()
        self._pending_bytes = 0
        self._unsent = 0  # items queued or in the writer's hands, not yet sent or dropped
        self._wake = threading.Condition(threading.Lock())  # not an RLock: cheaper per put
        self._writer: threading.Thread | None = None
        self._closed = False
        _links.add(self)

    # ------------------------------------------------------------- counts

    def _count(self, deltas: dict[str, int]) -> None:
        """Add to this process's counts; they reach the header within ``SETTLE_S``."""
        with self._counts_lock:
            counts = self._counts
            for name, delta in deltas.items():
                counts[name] = counts.get(name, 0) + delta
            due = time.monotonic() >= self._settle_at
        if due:
            self.settle()

    def settle(self) -> None:
        """Write the counts added up so far to the pool's header."""
        with self._counts_lock:
            counts, self._counts = self._counts, {}
            self._settle_at = time.monotonic() + SETTLE_S
        if counts:
            self._to_header(counts)

    # ------------------------------------------------------------- calls

    @property
    def is_down(self) -> bool:
        return self.problem is not None

    def call(self, action: Callable[[Any], T], default: T, *, extra_bytes: int = 0) -> T:
        """``action(client)``, or ``default`` if the remote is down or the call fails or
        outlives its deadline (the timeout, plus ``extra_bytes`` at ``MIN_RATE_BYTES_S``)."""
        client = self._usable_client()
        if client is None:
            return default
        started = time.perf_counter()
        deadline_s = self.spec.timeout_s + extra_bytes / MIN_RATE_BYTES_S

        def interrupt() -> None:
            self._cut_why[client] = f"Timeout: no whole answer within {deadline_s:.3g} s"
            self._cut(client)

        try:
            with self._watchdog.deadline(deadline_s, interrupt):
                result = action(client)
        except Exception as exc:  # anything a foreign service on the port makes redis-py raise
            # a read whose socket a deadline shut (its own, or a call beside it): say why
            why = self._cut_why.get(client)
            self._fail(exc if why is None else TimeoutError(why), client)
            return default
        self._count({"calls": 1, "micros": int((time.perf_counter() - started) * 1e6)})
        if self.problem is not None:
            with self._guard:
                self.problem, self._backoff = None, FIRST_BACKOFF_S
            log.warning("remote %s is back", self.spec.url)
        return result

    def _usable_client(self) -> Any:
        with self._guard:
            if self.problem is not None and time.monotonic() < self._retry_at:
                return None
            if self._client is not None:
                return self._client
        if not self._load_key():
            return None
        try:
            client = connect(self.spec)  # a Cluster client asks its nodes for the slot map
        except Exception as exc:  # redis-py missing, a password file unreadable, ...
            self._fail(exc)
            return None
        with self._guard:
            if self._client is None:
                self._client = client
            return self._client

    def _load_key(self) -> bool:
        """Read the key that signs records, once; False (the remote down) if it cannot be."""
        if self._key_loaded:
            return True
        try:
            key = self.spec.key()
        except KVCacheError as exc:
            self._fail(exc)
            return False
        with self._guard:
            self._mac_key, self._key_loaded = key, True
        return True

    def _cut(self, client: Any) -> None:
        """Shut the client's sockets: a read blocked in it fails now (its deadline passed)."""
        with contextlib.suppress(Exception):
            if hasattr(client, "connection_pool"):
                client.connection_pool.disconnect()
            else:  # a Cluster client: a pool per node
                client.close()

    def _fail(self, exc: BaseException, client: Any = None) -> None:
        with self._guard:
            if client is not None and client is self._client:
                self._client = None  # a fresh one next time: this one may be half-read or cut
                self._cut(client)
            first = self.problem is None
            self.problem = f"{type(exc).__name__}: {exc}"
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        self._count({"errors": 1})
        if first:  # one warning per outage, not one per call
            log.warning(
                "remote %s is down (%s): working on the local tiers, retrying with backoff",
                self.spec.url,
                self.problem,
            )

    def ping(self) -> float | None:
        """Seconds one PING took, or None if the remote is down."""

        def timed(client: Any) -> float:
            started = time.perf_counter()
            client.ping()
            return time.perf_counter() - started

        return self.call(timed, None)

    # ------------------------------------------------------------- reads

    def fetch(self, keys: Sequence[bytes]) -> list[records.Decoded | None]:
        """The verified entries of ``keys`` (None: a miss), in two pipelined round trips
        at most: heads first, then the further parts of the entries that have them."""
        if not keys:
            return []
        names = [records.key_name(self.spec.namespace, key) for key in keys]
        limit = self.max_entry_bytes
        # what the first parts may weigh: KV chunks of megabytes each, at 100 MB/s, take
        # longer than the timeout alone (a deadline of 0.25 s cut 31 chunks of 1 MiB)
        heads_bytes = len(names) * min(limit, self.part_bytes)
        heads = self.call(lambda client: _get_all(client, names), None, extra_bytes=heads_bytes)
        if heads is None:
            return [None] * len(keys)
        split = [(i, records.parts_of(head, limit)) for i, head in enumerate(heads)]
        split = [(i, n) for i, n in split if n > 1]
        found: list[list[object]] = [[head] for head in heads]
        if split:
            # GETs, not MGET: a Cluster pipeline refuses MGET. Parts read apart may mix
            # two writers' values; the checksum over all parts then makes it a miss.
            rest_names = [part for i, n in split for part in records.part_names(names[i], n)]
            declared = sum(min(limit, (n - 1) * self.part_bytes) for _, n in split)
            rest = self.call(
                lambda client: _get_all(client, rest_names), None, extra_bytes=declared
            )
            if rest is None:
                return [None] * len(keys)
            parts = iter(rest)
            for i, n in split:
                found[i].extend(next(parts) for _ in range(n - 1))
        return self._decoded(keys, found)

    def _decoded(
        self, keys: Sequence[bytes], found: list[list[object]]
    ) -> list[records.Decoded | None]:
        """Verify what a fetch found: damaged records are deleted, rejected ones left."""
        decoded: list[records.Decoded | None] = []
        faults = {fault: 0 for fault in records.Fault}
        received = 0
        for key, parts in zip(keys, found, strict=True):
            verdict = records.decode(
                key, parts, max_bytes=self.max_entry_bytes, mac_key=self._mac_key
            )
            if isinstance(verdict, records.Fault):
                faults[verdict] += 1
                if verdict is records.Fault.DAMAGED:
                    self.delete(key)  # ours, but torn or half evicted: never served, removed
            received += sum(len(part) for part in parts if isinstance(part, bytes))
            decoded.append(None if isinstance(verdict, records.Fault) else verdict)
        hits = sum(entry is not None for entry in decoded)
        self._count(
            {
                "hits": hits,
                "misses": len(keys) - hits,
                "bytes_in": received,
                "damaged": faults[records.Fault.DAMAGED],
                "rejected": faults[records.Fault.REJECTED],
            }
        )
        return decoded

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key has an entry in the remote: one pipelined round trip."""
        if not keys:
            return []
        names = [records.key_name(self.spec.namespace, key) for key in keys]

        def probe(client: Any) -> list[bool]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            return [n is True or (type(n) is int and n > 0) for n in pipe.execute()]

        return self.call(probe, [False] * len(keys))

    # ------------------------------------------------------------- writes

    def store(self, entry: records.StoredEntry, views: Sequence[Any]) -> bool:
        """Queue an entry (its bytes copied now) to be written; whether it was."""
        encoded = self.encode(entry, views)
        return encoded is not None and self.send(entry, encoded)

    def encode(self, entry: records.StoredEntry, views: Sequence[Any]) -> records.Encoded | None:
        """A copy of an entry's bytes (key | value header | payload) ready to queue; None
        (counted as dropped) when the queue has no room or the remote is down."""
        if self.problem is not None and time.monotonic() < self._retry_at:
            self._count({"dropped": 1})
            return None
        if self._pending_bytes + entry.num_bytes > MAX_PENDING_BYTES or not self._load_key():
            self._count({"dropped": 1})
            return None
        return records.encode(entry, views, self.part_bytes, self._mac_key)

    def send(self, entry: records.StoredEntry, encoded: records.Encoded) -> bool:
        """Queue ``encoded`` (from :meth:`encode`) to be written under ``entry``'s key."""
        name = records.key_name(self.spec.namespace, entry.key)
        self._enqueue(_Put(name, encoded, entry.expires_at), encoded.num_bytes)
        return True

    def delete(self, key: bytes) -> None:
        """Queue the removal of ``key``'s entry from the remote."""
        self._enqueue(_Delete(records.key_name(self.spec.namespace, key)), 0)

    def _enqueue(self, item: _Put | _Delete, num_bytes: int) -> None:
        with self._wake:
            self._queue.append(item)
            self._pending_bytes += num_bytes
            self._unsent += 1
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_forever, name="kvcache-remote-writer", daemon=True
                )
                self._writer.start()
            if len(self._queue) == 1:  # the writer waits only on an empty queue
                self._wake.notify()

    def flush(self, timeout_s: float = EXIT_FLUSH_S) -> bool:
        """Wait until everything queued was sent (or dropped); whether it was, in time.
        The counts so far are in the header afterwards."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._unsent:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(min(left, 0.05))
            sent = not self._unsent
        self.settle()
        return sent

    def _write_forever(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    if self._closed:
                        return
                    self._wake.wait()
                batch: list[_Put | _Delete] = []
                size = 0
                while self._queue and size < BATCH_BYTES:
                    item = self._queue.popleft()
                    batch.append(item)
                    size += item.encoded.num_bytes if isinstance(item, _Put) else 0
            sent = self.call(
                lambda client, b=batch: _send(client, b, self.max_entry_bytes),  # type: ignore[misc]
                None,
                extra_bytes=size,
            )
            # counted before flush() may return: a caller that flushed sees its writes counted
            if sent is None:
                self._count({"dropped": sum(isinstance(i, _Put) for i in batch)})
            else:
                self._count({"writes": sent, "bytes_out": size})
            with self._wake:
                self._pending_bytes -= size
                self._unsent -= len(batch)
                self._wake.notify_all()

    def close(self) -> None:
        """Send what is queued (for ``EXIT_FLUSH_S`` at most) and stop the writer."""
        self.flush()
        with self._wake:
            self._closed = True
            self._wake.notify_all()


def _get_all(client: Any, names: list[str]) -> list[object]:
    """GET each name in one pipeline. A key of another type answers WRONGTYPE, which
    is that key's reply (a miss for it), not the call's failure; any other error
    answer (NOAUTH, LOADING, OOM) fails the call."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    replies: list[object] = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, Exception) and not str(reply).startswith("WRONGTYPE"):
            raise reply
    if len(replies) != len(names):
        raise ValueError(f"{len(replies)} replies to {len(names)} GETs")
    return replies


def _send(client: Any, batch: list[_Put | _Delete], max_entry_bytes: int) -> int:
    """Write ``batch`` in order, in runs of puts and runs of deletes; the puts sent."""
    puts = 0
    i = 0
    while i < len(batch):
        kind = type(batch[i])
        j = i
        while j < len(batch) and type(batch[j]) is kind:
            j += 1
        run = batch[i:j]
        if kind is _Put:
            _send_puts(client, run)  # type: ignore[arg-type]
            puts += len(run)
        else:
            _send_deletes(client, [item.name for item in run], max_entry_bytes)
        i = j
    return puts


def _send_puts(client: Any, puts: list[_Put]) -> None:
    pipe = client.pipeline(transaction=False)
    now = time.time()
    for put in puts:
        if put.expires_at != math.inf:
            ttl_ms = int((put.expires_at - now) * 1000)
            if ttl_ms <= 0:
                continue  # expired while queued
        else:
            ttl_ms = None
        names = [put.name, *records.part_names(put.name, len(put.encoded.parts))]
        # Further parts first, the head last: a reader that finds the new head finds its parts.
        for name, part in [
            *zip(names[1:], put.encoded.parts[1:], strict=True),
            (names[0], put.encoded.parts[0]),
        ]:
            pipe.set(name, part, px=ttl_ms)
    pipe.execute()


def _send_deletes(client: Any, names: list[str], max_entry_bytes: int) -> None:
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.getrange(name, 0, records.HEAD.size - 1)
    heads = pipe.execute(raise_on_error=False)  # WRONGTYPE: not ours, deleted alone
    pipe = client.pipeline(transaction=False)
    for name, head in zip(names, heads, strict=True):
        pipe.delete(name, *records.part_names(name, records.parts_of(head, max_entry_bytes)))
    pipe.execute()


_links: weakref.WeakSet[RemoteLink] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for link in list(_links):
        link.close()
