"""Prometheus exposition of every pool on the machine (``kvcache metrics``).

``PoolCollector`` is a ``prometheus_client`` collector that opens each pool at scrape
time (alone: ``open(chain=False)``, so no remote tier is dialled), reads its
counters (``Pool.stats``, ``Pool.metrics``, ``Pool.remote_counts``) and closes it
again. Nothing is cached between scrapes: every number comes from the segments,
so whichever process serves ``/metrics``, it reports what all processes did.

Families (labels ``pool`` and ``tier``; ``tier`` is ``cpu``, ``disk`` or, for the
remote tier's counters, ``remote``):

====================================================  =====================================
``kvcache_hits_total`` / ``kvcache_misses_total``     lookups found / not found
``kvcache_puts_total``                                entries stored (remote: written)
``kvcache_written_bytes_total``                       value bytes stored (remote: sent)
``kvcache_read_bytes_total``                          value bytes of hits (remote: received)
``kvcache_evictions_total{reason}``                   capacity, expiry, explicit
``kvcache_spills_total`` / ``kvcache_promotions_total``  moves down / up the chain
``kvcache_errors_total``                              refused puts (remote: failed calls),
                                                      integrations' failed restores/saves
``kvcache_damaged_entries_total``                     entries dropped for a bad checksum
``kvcache_repairs_total``                             repairs after a crash or ``--repair``
``kvcache_dropped_writes_total``                      remote writes dropped (queue, down)
``kvcache_remote_call_seconds_total`` / ``_calls_total``  time in remote calls, and calls
``kvcache_size_bytes`` / ``kvcache_used_bytes``       capacity and bytes in use
``kvcache_entries`` / ``kvcache_attached_processes``  live entries, processes attached
``kvcache_operation_duration_seconds{op}``            sampled latency: get, put, lookup,
                                                      retrieve (histogram)
``kvcache_eviction_regret_seconds``                   sampled evicted keys asked for again,
                                                      by seconds since their eviction
``kvcache_eviction_regret_accesses``                  ... by the pool's accesses since
``kvcache_eviction_regret_unrequested_total``         sampled evicted keys not asked for
                                                      while in the sample
``kvcache_eviction_regret_sampled_one_in``            the sample's rate (``kvcache.regret``)
``kvcache_prefix_query_tokens_total{model}``          tokens PrefixCache.retrieve asked for
``kvcache_prefix_hit_tokens_total{model}``            ... and found (hit rate in tokens)
``kvcache_prefix_stored_tokens_total{model}``         tokens PrefixCache.store wrote
``kvcache_unreadable_pools``                          pools this exporter could not open
====================================================  =====================================

``Server`` answers scrapes over HTTP on a fixed few threads (``SERVING_THREADS``)
fed by a bounded queue of connections, not a thread per connection as
``prometheus_client.start_http_server`` does (300 idle connections made 303
threads); a connection that sends nothing for ``REQUEST_TIMEOUT_S``, or is
not done ``CONNECTION_DEADLINE_S`` after a thread took it, is dropped, and one
that finds the queue full is closed at once (a scraper retries at its next
interval). It serves ``/metrics`` only: every other path,
``/`` included, is a 404 whose body names ``/metrics`` (we chose no landing
page: nothing to keep in step, and a person who opens ``/`` is told where to
look).

Needs the ``metrics`` extra (``pip install 'kvcache[metrics]'``).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client import write_to_textfile as _write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import lifecycle
from .errors import InvalidArgument, KVCacheError, PoolDestroyedError, PoolNotFoundError
from .reports import Histogram, PoolMetrics, PoolStats, Regret

if TYPE_CHECKING:  # wsgiref.types is Python 3.11's; typeshed has them for 3.10 too
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464
METRICS_PATH = "/metrics"
SERVING_THREADS = 4
"""Threads answering scrapes: a scrape opens each pool for well under a millisecond,
and one or two Prometheus servers scrape every few seconds."""
WAITING_CONNECTIONS = 16
"""Connections accepted and waiting for a thread; more are closed at once."""
REQUEST_TIMEOUT_S = 5.0
"""A connection silent this long (each read of its request, each write of the answer)
is dropped, freeing its thread; Prometheus sends its whole request at once."""
CONNECTION_DEADLINE_S = 10.0
"""A connection still being answered this long after a thread took it is cut, so a
client that drips its request a byte at a time cannot hold a thread for good."""
POOL_LABELS = ("pool", "tier")

_COUNTERS: dict[str, str] = {
    "hits": "Lookups that found their key.",
    "misses": "Lookups that did not find their key.",
    "puts": "Entries stored (the remote tier: entries written to it).",
    "written_bytes": "Value bytes stored (the remote tier: bytes sent to it).",
    "read_bytes": "Value bytes of hits (the remote tier: bytes received from it).",
    "spills": "Entries evictions moved to the pool below.",
    "promotions": "Entries a hit below moved up into this pool.",
    "errors": "Puts refused for lack of room or memory (the remote tier: failed calls); "
    "cache failures an integration served around (e.g. the llama-server proxy's).",
    "damaged_entries": "Entries dropped because their bytes no longer matched their checksum.",
    "repairs": "Repairs of the pool's metadata after a crash or on request.",
    "dropped_writes": "Entries not written to the remote tier (queue full, remote down).",
    "remote_calls": "Calls to the remote tier.",
    "remote_call_seconds": "Seconds spent in calls to the remote tier.",
}
_GAUGES: dict[str, str] = {
    "size_bytes": "The pool's capacity for data.",
    "used_bytes": "Bytes of pages and inline slots held by entries.",
    "entries": "Live entries.",
    "attached_processes": "Processes with the pool open to work in it (the exporter not counted).",
}
_TOKENS: dict[str, str] = {
    "query": "Prompt tokens PrefixCache.retrieve was asked for.",
    "hit": "Tokens PrefixCache.retrieve found cached (hit rate = hit / query).",
    "stored": "Tokens whose KV PrefixCache.store wrote.",
}


@dataclass(frozen=True)
class _Reading:
    """What one scrape read from one pool."""

    stats: PoolStats
    metrics: PoolMetrics
    remote: dict[str, int] | None


class PoolCollector(Collector):
    """Reads every pool at each scrape (``names``: which pools, default all).

    Args:
        names: the pools to report, called at each scrape (default ``list_pools``).
        open_kwargs: passed to :func:`kvcache.open` (``trust_owner``, ``trust_group``).
    """

    def __init__(
        self, names: Callable[[], Iterable[str]] = lifecycle.list_pools, **open_kwargs: Any
    ) -> None:
        self._names = names
        self._open_kwargs = open_kwargs

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on the pools: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        readings: list[_Reading] = []
        unreadable = 0
        for name in self._names():
            try:
                readings.append(self._read(name))
            except (PoolNotFoundError, PoolDestroyedError):
                pass  # destroyed since it was listed: gone, not unreadable (no alert flaps)
            except KVCacheError:
                unreadable += 1  # another user's, damaged, or of another format
        yield from _families(readings)
        yield GaugeMetricFamily(
            "kvcache_unreadable_pools",
            "Pools listed on this machine that the exporter could not open.",
            value=unreadable,
        )

    def _read(self, name: str) -> _Reading:
        with lifecycle.open(name, chain=False, observe=True, **self._open_kwargs) as pool:
            return _Reading(pool.stats(), pool.metrics(), pool.remote_counts())


def _families(readings: list[_Reading]) -> Iterator[Metric]:
    counters = {
        name: CounterMetricFamily(f"kvcache_{name}", text, labels=POOL_LABELS)
        for name, text in _COUNTERS.items()
    }
    evictions = CounterMetricFamily(
        "kvcache_evictions",
        "Entries evicted, by reason: capacity (to make room), expiry, explicit (evict).",
        labels=(*POOL_LABELS, "reason"),
    )
    gauges = {
        name: GaugeMetricFamily(f"kvcache_{name}", text, labels=POOL_LABELS)
        for name, text in _GAUGES.items()
    }
    tokens = {
        name: CounterMetricFamily(
            f"kvcache_prefix_{name}_tokens", text, labels=(*POOL_LABELS, "model")
        )
        for name, text in _TOKENS.items()
    }
    latency = HistogramMetricFamily(
        "kvcache_operation_duration_seconds",
        "Sampled duration of get, put, PrefixCache lookup and retrieve calls.",
        labels=(*POOL_LABELS, "op"),
    )
    regret = _regret_families()
    for reading in readings:
        stats, metrics = reading.stats, reading.metrics
        labels = [stats.name, metrics.tier]
        local = {
            "hits": stats.hits,
            "misses": stats.misses,
            "puts": stats.puts,
            "written_bytes": stats.bytes_in,
            "read_bytes": stats.bytes_out,
            "spills": stats.spills,
            "promotions": stats.promotions,
            "errors": stats.errors,
            "damaged_entries": stats.damaged,
            "repairs": stats.repairs,
        }
        for name, value in local.items():
            counters[name].add_metric(labels, value)
        by_reason = {
            "capacity": stats.evictions - stats.evictions_explicit,
            "expiry": stats.expirations,
            "explicit": stats.evictions_explicit,
        }
        for reason, value in by_reason.items():
            evictions.add_metric([*labels, reason], value)
        for name, value in (
            ("size_bytes", stats.size_bytes),
            ("used_bytes", stats.used_bytes),
            ("entries", stats.num_entries),
            ("attached_processes", stats.num_attached),
        ):
            gauges[name].add_metric(labels, value)
        for model, counts in metrics.tokens.items():
            tokens["query"].add_metric([*labels, model], counts.queried)
            tokens["hit"].add_metric([*labels, model], counts.hit)
            tokens["stored"].add_metric([*labels, model], counts.stored)
        for op, histogram in metrics.latency.items():
            latency.add_metric([*labels, op], _buckets(histogram), histogram.sum_s)
        if metrics.regret is not None:
            _add_regret(regret, labels, metrics.regret)
        if reading.remote is not None:
            _add_remote(counters, stats.name, reading.remote)
    yield from counters.values()
    yield evictions
    yield from gauges.values()
    yield from tokens.values()
    yield latency
    yield from regret


class _RegretFamilies(NamedTuple):
    seconds: HistogramMetricFamily
    accesses: HistogramMetricFamily
    unrequested: CounterMetricFamily
    sampled_one_in: GaugeMetricFamily


def _regret_families() -> _RegretFamilies:
    return _RegretFamilies(
        HistogramMetricFamily(
            "kvcache_eviction_regret_seconds",
            "Sampled evicted keys asked for again, by seconds from eviction to the request "
            "(many soon after: a larger pool would have served them).",
            labels=POOL_LABELS,
        ),
        HistogramMetricFamily(
            "kvcache_eviction_regret_accesses",
            "Sampled evicted keys asked for again, by the pool's accesses (puts and hits) "
            "from eviction to the request.",
            labels=POOL_LABELS,
        ),
        CounterMetricFamily(
            "kvcache_eviction_regret_unrequested",
            "Sampled evicted keys not asked for again while in the sample (about twice "
            "the entry slots in evictions).",
            labels=POOL_LABELS,
        ),
        GaugeMetricFamily(
            "kvcache_eviction_regret_sampled_one_in",
            "Evicted keys are sampled 1 in this many, by key hash.",
            labels=POOL_LABELS,
        ),
    )


def _add_regret(families: _RegretFamilies, labels: list[str], regret: Regret) -> None:
    for family, histogram in (
        (families.seconds, regret.seconds),
        (families.accesses, regret.accesses),
    ):
        family.add_metric(labels, _cumulative(histogram.bounds, histogram.counts), histogram.sum)
    families.unrequested.add_metric(labels, regret.unrequested)
    families.sampled_one_in.add_metric(labels, regret.sampled_one_in)


def _add_remote(counters: dict[str, CounterMetricFamily], pool: str, r: dict[str, int]) -> None:
    labels = [pool, "remote"]
    for name, value in (
        ("hits", r["hits"]),
        ("misses", r["misses"]),
        ("puts", r["writes"]),
        ("written_bytes", r["bytes_out"]),
        ("read_bytes", r["bytes_in"]),
        ("errors", r["errors"]),
        ("damaged_entries", r["damaged"]),
        ("dropped_writes", r["dropped"]),
        ("remote_calls", r["calls"]),
        ("remote_call_seconds", r["micros"] / 1e6),
    ):
        counters[name].add_metric(labels, value)


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    return _cumulative(histogram.bounds_s, histogram.counts)


def _cumulative(bounds_: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, +Inf last, as Prometheus histograms have them."""
    bounds = [f"{bound:g}" for bound in bounds_] + ["+Inf"]
    cumulative, total = [], 0
    for bound, count in zip(bounds, counts, strict=True):
        total += count
        cumulative.append((bound, float(total)))
    return cumulative


def registry(pools: Sequence[str] = (), **open_kwargs: Any) -> CollectorRegistry:
    """A registry holding a :class:`PoolCollector` (and nothing else) of ``pools``, or of
    every pool on the machine without them. The functions below pass their keyword
    arguments here."""
    reg = CollectorRegistry(auto_describe=False)
    names = (lambda: pools) if pools else lifecycle.list_pools
    reg.register(PoolCollector(names, **open_kwargs))
    return reg


def exposition(**open_kwargs: Any) -> str:
    """The text exposition of every pool, once (``kvcache metrics``)."""
    return generate_latest(registry(**open_kwargs)).decode()


def write_textfile(path: str, **open_kwargs: Any) -> None:
    """Write the exposition to ``path`` for node_exporter's textfile collector, atomically
    (a temporary file in the same folder, renamed over ``path``).

    Raises:
        InvalidArgument: the folder does not exist or cannot be written.
    """
    try:
        _write_to_textfile(path, registry(**open_kwargs))
    except OSError as exc:
        raise InvalidArgument(
            f"cannot write {path} ({exc.strerror}): give a file in an existing, writable folder"
        ) from None


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (host default 127.0.0.1).

    Raises:
        InvalidArgument: not an address with a port in 0-65535 (0: any free port).
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidArgument(
            f"cannot serve on {text!r}: give HOST:PORT, e.g. {DEFAULT_HOST}:{DEFAULT_PORT}"
        )
    return host, int(port)


class Server:
    """An HTTP ``/metrics`` endpoint in a background thread (``kvcache metrics --serve``).

    Raises:
        InvalidArgument: the address cannot be bound (in use, not this machine's).
    """

    def __init__(self, host: str, port: int, **open_kwargs: Any) -> None:
        app = _only_metrics(make_wsgi_app(registry(**open_kwargs)))
        try:
            self._httpd = _BoundedServer(host, port, app)
        except OSError as exc:
            raise InvalidArgument(
                f"cannot serve on {host}:{port} ({exc.strerror}): pick another --serve address"
            ) from None
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="kvcache-metrics-accept", daemon=True
        )
        self._thread.start()

    def wait(self, stop: threading.Event | None = None) -> None:
        """Serve until ``stop`` is set (or forever)."""
        (stop or threading.Event()).wait()

    def close(self) -> None:
        """Stop serving and free the port."""
        with contextlib.suppress(OSError):
            self._httpd.shutdown()
            self._httpd.server_close()


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler sets it on the connection

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: a scrape every few seconds is not news on stderr."""


class _BoundedServer(WSGIServer):
    """wsgiref's server answering connections on ``SERVING_THREADS`` daemon threads,
    from a queue of at most ``WAITING_CONNECTIONS``; a connection that finds it full
    is closed at once."""

    def __init__(self, host: str, port: int, app: WSGIApplication) -> None:
        self._waiting: queue.Queue[tuple[socket.socket, Any] | None] = queue.Queue(
            WAITING_CONNECTIONS
        )  # before the base's __init__, whose server_close (on a failed bind) drains it
        self._deadlines: dict[socket.socket, float] = {}  # connections being answered
        self._deadlines_lock = threading.Lock()
        family, address = _address(host, port)
        self.address_family = family  # read by the base's __init__, which makes the socket
        super().__init__(address, _QuietHandler)
        self.set_app(app)
        for _ in range(SERVING_THREADS):
            threading.Thread(target=self._answer, name="kvcache-metrics", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self._waiting.put_nowait((request, client_address))
        except queue.Full:
            self.shutdown_request(request)

    def server_close(self) -> None:
        """Close the port and the connections still waiting, and end the threads (after
        ``shutdown``: nothing is queued any more)."""
        super().server_close()
        with contextlib.suppress(queue.Empty):
            while waiting := self._waiting.get_nowait():
                self.shutdown_request(waiting[0])
        for _ in range(SERVING_THREADS):
            self._waiting.put(None)

    def service_actions(self) -> None:
        """Cut the connections past their deadline (``serve_forever`` calls this about
        twice a second): a shut-down socket ends the read or write its thread waits in."""
        now = time.monotonic()
        with self._deadlines_lock:
            overdue = [request for request, end in self._deadlines.items() if end < now]
        for request in overdue:
            with contextlib.suppress(OSError):  # answered and closed meanwhile
                request.shutdown(socket.SHUT_RDWR)

    def _answer(self) -> None:
        while waiting := self._waiting.get():
            request, client_address = waiting
            with self._deadlines_lock:
                self._deadlines[request] = time.monotonic() + CONNECTION_DEADLINE_S
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                with self._deadlines_lock:
                    del self._deadlines[request]
                self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went silent or away is dropped quietly; anything else is a bug,
        reported as the base class does (a traceback on stderr)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """The family (IPv4 or IPv6) and socket address to bind ``host:port`` with."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, (str(address[0]), int(address[1]))


def _only_metrics(app: WSGIApplication) -> WSGIApplication:
    """``app`` at ``/metrics``; a 404 naming ``/metrics`` everywhere else."""

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"404 not found: kvcache serves Prometheus metrics at {METRICS_PATH}\n".encode()]

    return serve
