"""What pool operations report: frozen dataclasses with ``to_dict`` for JSON."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's occupancy and counters (shared by all processes)."""

    name: str
    policy: str
    size_bytes: int
    used_bytes: int  # pages held by entries (READY and being written)
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
    attached: tuple[int, ...]  # pids of live processes that have the pool open

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
class EvictionResult:
    """What one ``Pool.evict`` call removed."""

    num_entries: int  # removed by the policy
    num_expired: int  # removed because they had expired
    num_bytes: int  # page bytes freed by both

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)
