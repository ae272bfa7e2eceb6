"""What pool operations report: frozen dataclasses with ``to_dict`` for JSON."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .counters import LATENCY_BOUNDS_S, MAX_MODELS, OPS, OTHER_MODEL, TOKEN_COUNTERS
from .layout import VALUE_IS_ARRAY


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's occupancy and counters (shared by all processes)."""

    name: str
    policy: str
    size_bytes: int  # room for entries' bytes: pages and inline slots (``capacity_bytes``)
    used_bytes: int  # pages held by entries (READY and being written), inline slots held
    free_bytes: int
    page_size_bytes: int
    num_entries: int
    max_entries: int
    hits: int
    misses: int
    puts: int
    evictions: int
    expirations: int
    repairs: int
    damaged: int  # entries dropped because their bytes no longer matched their checksum
    spills: int  # entries evictions moved to the lower pool
    promotions: int  # entries a hit below moved up into this pool
    bytes_in: int  # value bytes stored (puts, restores, spills and promotions into this pool)
    bytes_out: int  # value bytes of hits
    evictions_explicit: int  # of evictions: entries removed by evict(), not to make room
    errors: int  # puts refused: no room, or no memory to grow into
    attached: tuple[int, ...]  # pids of live processes with the pool open, in this PID namespace
    num_attached: int  # live processes with the pool open, in every PID namespace

    @property
    def hit_rate(self) -> float:
        """Hits over lookups, 0.0 before the first lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain fields plus ``hit_rate``, for JSON."""
        fields = dataclasses.asdict(self)
        fields["attached"] = list(self.attached)
        fields["hit_rate"] = self.hit_rate
        return fields


@dataclass(frozen=True)
class Histogram:
    """Sampled latencies of one operation: counts per bucket (not cumulative) and their sum.

    ``counts[i]`` counts samples of at most ``bounds_s[i]`` seconds (and more than
    the bound before); the last count, past every bound, is +Inf's.
    """

    counts: tuple[int, ...]
    sum_s: float
    bounds_s: tuple[float, ...] = LATENCY_BOUNDS_S

    @property
    def count(self) -> int:
        """Samples in all buckets."""
        return sum(self.counts)

    @property
    def mean_s(self) -> float:
        """Mean duration, 0.0 without samples."""
        return self.sum_s / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (inf past the last
        bound, 0.0 without samples): an estimate within a factor of two."""
        needed, seen = q * self.count, 0
        for bound, count in zip((*self.bounds_s, math.inf), self.counts, strict=True):
            seen += count
            if seen and seen >= needed:
                return bound
        return 0.0


@dataclass(frozen=True)
class TokenCounts:
    """A PrefixCache model's tokens: asked for by ``retrieve``, found, and stored."""

    queried: int
    hit: int
    stored: int


@dataclass(frozen=True)
class PoolMetrics:
    """What ``Pool.metrics`` reports: latency by operation and tokens by model."""

    name: str
    tier: str
    latency: dict[str, Histogram]  # get, put, lookup, retrieve
    tokens: dict[str, TokenCounts]  # by model id; "other" past the first 16 models
    reset_at: float | None  # wall clock of the last reset_stats, None = never
    regret: Regret | None = None  # evicted keys asked for again, and how soon

    @classmethod
    def from_region(
        cls, name: str, tier: str, region: np.ndarray, regret: Regret | None = None
    ) -> PoolMetrics:
        """From a copy of the segment's metrics region (``counters.METRICS_DTYPE``) and the
        header's regret sample (``kvcache.regret``)."""
        latency = {
            op: Histogram(tuple(region["latency"][i].tolist()), int(region["latency_ns"][i]) / 1e9)
            for i, op in enumerate(OPS)
        }
        rows = region["model_tokens"].tolist()
        names = [raw.decode(errors="replace") for raw in region["model_names"].tolist()]
        tokens = {model: TokenCounts(*rows[row]) for row, model in enumerate(names) if model}
        if any(rows[MAX_MODELS]):
            tokens[OTHER_MODEL] = TokenCounts(*rows[MAX_MODELS])
        reset_at = float(region["reset_at"])
        return cls(name, tier, latency, tokens, reset_at or None, regret)

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)


assert tuple(f.name for f in dataclasses.fields(TokenCounts)) == TOKEN_COUNTERS


@dataclass(frozen=True)
class Rates:
    """What a pool did per second between two ``stats`` (``kvcache status --watch``)."""

    interval_s: float
    hits_per_s: float
    misses_per_s: float
    puts_per_s: float
    in_bytes_per_s: float  # value bytes stored
    out_bytes_per_s: float  # value bytes of hits
    evictions_per_s: float  # of every reason: capacity, expiry, explicit
    used_bytes: int  # at the end of the interval
    num_entries: int
    num_attached: int

    @classmethod
    def between(cls, before: PoolStats, after: PoolStats, interval_s: float) -> Rates:
        """The rates from ``before`` to ``after``, ``interval_s`` apart; a counter that went
        down (``reset_stats`` meanwhile) counts from zero."""

        def rate(name: str) -> float:
            now, then = getattr(after, name), getattr(before, name)
            return (now - then if now >= then else now) / interval_s

        return cls(
            interval_s,
            rate("hits"),
            rate("misses"),
            rate("puts"),
            rate("bytes_in"),
            rate("bytes_out"),
            rate("evictions") + rate("expirations"),
            after.used_bytes,
            after.num_entries,
            after.num_attached,
        )

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EvictionResult:
    """What one ``Pool.evict`` call removed."""

    num_entries: int  # removed by the policy
    num_expired: int  # removed because they had expired
    num_bytes: int  # bytes freed by both: pages, and inline slots

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EntryInfo:
    """One live entry as ``Pool.entries`` lists it."""

    key: str | bytes
    size_bytes: int  # key, value header and payload
    value_bytes: int  # payload only
    is_array: bool
    priority: int
    expires_at: float | None  # wall clock, None = never
    accessed_at: float  # wall clock (Unix seconds) of the last put or hit
    created_at: float  # wall clock of the put
    last_access: int  # logical clock (what recency policies compare)
    created: int  # logical clock
    frequency: float  # LFU count as of last_access

    @classmethod
    def from_record(cls, key: str | bytes, record: np.void) -> EntryInfo:
        """Build from an entry-table record (``layout.ENTRY_DTYPE``)."""
        expires_at = float(record["expires_at"])
        return cls(
            key=key,
            size_bytes=int(record["key_len"] + record["header_len"] + record["value_len"]),
            value_bytes=int(record["value_len"]),
            is_array=bool(record["flags"] & VALUE_IS_ARRAY),
            priority=int(record["priority"]),
            expires_at=None if math.isinf(expires_at) else expires_at,
            accessed_at=float(record["accessed_at"]),
            created_at=float(record["created_at"]),
            last_access=int(record["last_access"]),
            created=int(record["created"]),
            frequency=float(record["freq"]),
        )

    def to_dict(self) -> dict[str, object]:
        """Plain fields for JSON; bytes keys become ``repr`` text."""
        fields = dataclasses.asdict(self)
        if isinstance(self.key, bytes):
            fields["key"] = repr(self.key)
        return fields


@dataclass(frozen=True)
class RemoteStats:
    """A pool's remote tier: where it is, whether this process reaches it, and its
    counters (kept in the pool's header, shared by every process that uses it)."""

    url: str
    namespace: str
    write_through: bool
    up: bool  # as this process last found it
    problem: str | None  # why it is down
    hits: int
    misses: int
    bytes_in: int
    bytes_out: int
    writes: int  # entries written (demoted or written through)
    dropped: int  # entries not written: the queue was full or the remote down
    errors: int  # failed calls
    damaged: int  # entries found damaged, torn or half evicted (a miss; deleted)
    rejected: int  # records failing the pool's MAC, or replies no record gets (a miss)
    calls: int
    micros: int

    @property
    def mean_latency_s(self) -> float:
        """Mean time of a successful call, 0.0 before the first one."""
        return self.micros / self.calls / 1e6 if self.calls else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "mean_latency_s": self.mean_latency_s}


@dataclass(frozen=True)
class RegretHistogram:
    """Keys asked for again after their eviction, by how long after: counts per bucket
    (not cumulative; the last past every bound, +Inf's) and their sum."""

    counts: tuple[int, ...]
    sum: float
    bounds: tuple[float, ...]

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (inf past the last bound,
        0.0 without samples)."""
        return Histogram(self.counts, self.sum, self.bounds).quantile(q)


@dataclass(frozen=True)
class Regret:
    """What ``Pool.metrics`` reports of the sample: the two histograms over the same keys,
    records pushed out unasked, and the sampling rate (1 key in ``sampled_one_in``)."""

    seconds: RegretHistogram
    accesses: RegretHistogram
    unrequested: int
    sampled_one_in: int

    @property
    def share_asked_again(self) -> float:
        """Of the sampled evicted keys that left the sample, the share asked for again
        while in it (0.0 without any)."""
        asked = self.seconds.count
        return asked / (asked + self.unrequested) if asked + self.unrequested else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds_counts": list(self.seconds.counts),
            "seconds_sum": self.seconds.sum,
            "accesses_counts": list(self.accesses.counts),
            "accesses_sum": self.accesses.sum,
            "unrequested": self.unrequested,
            "sampled_one_in": self.sampled_one_in,
        }
