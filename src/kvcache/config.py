"""Pool configuration: one frozen, validated dataclass, stored in the segment.

The effective configuration is written into the pool's header at create time,
so every process that opens the pool (and, later, every snapshot) uses the
same geometry and policy; nobody has to repeat the flags.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgument
from .units import parse_duration, parse_size, whole_number

DEFAULT_PAGE_SIZE_BYTES = 64 << 10
"""64 KiB: a KV chunk of even a small model is hundreds of KiB, so waste per
entry stays small, and a 1 GiB pool needs only 16384 pages of metadata."""
MIN_PAGE_SIZE_BYTES = 1 << 10
MAX_PAGE_SIZE_BYTES = 256 << 20
MAX_KEY_BYTES = 1024
"""A key always fits in its entry's first page (pages are at least 1 KiB)."""
MAX_INLINE_BYTES = 4096
"""The largest inline slot: past a few KiB a value is better off in pages of its own
(an inline slot is paid for by every entry slot, used or not)."""
INLINE_ALIGN_BYTES = 16
"""Inline slots are whole 16-byte units, so that a slot can fit small entries closely (a
12-byte key and 64 bytes of value take 76 bytes: an 80-byte slot, where whole cache lines
would take 128). A multiple of 64 gives each slot cache lines of its own, which no other
entry's writes touch."""
MAX_INLINE_ENTRIES = 1 << 30
"""Entry slots a pool with inline slots may have (more than its pages)."""
DEFAULT_EVICTION_SAMPLES = 64
DEFAULT_MAX_PROCESSES = 1024


@dataclass(frozen=True)
class PoolConfig:
    """How a pool is laid out and evicts.

    Attributes:
        size_bytes: room for data (keys and values), rounded down to whole pages;
            metadata comes on top (<1% at the default page size).
        page_size_bytes: allocation unit; a power of two from 1 KiB to 256 MiB.
        policy: eviction policy name (see ``kvcache.policies``).
        max_entries: entry-table slots; default one per page (the most that can live).
        default_ttl_s: expiry applied to puts that give no ttl; ``None`` means never.
        eviction_samples: entries scored per eviction; more is closer to the exact
            policy and slower. Pools with at most this many entries evict exactly.
        lfu_half_life: LFU counters halve every this many accesses (logical clock
            ticks) without a hit; default ``max_entries``.
        max_processes: slots in the attached-process table.
        inline_bytes: bytes of each entry slot's inline slot, 0 = none. An entry whose
            key, value header and payload fit there takes no page (small values packed:
            a 64-byte value costs its record and its slot, not a page); more entries
            than pages are allowed then.
    """

    size_bytes: int
    page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES
    policy: str = "lru"
    max_entries: int = 0
    default_ttl_s: float | None = None
    eviction_samples: int = DEFAULT_EVICTION_SAMPLES
    lfu_half_life: int = 0
    max_processes: int = DEFAULT_MAX_PROCESSES
    inline_bytes: int = 0

    def __post_init__(self) -> None:
        from .policies import get_policy  # policies are a sibling layer, imported late

        page = self.page_size_bytes
        if not (MIN_PAGE_SIZE_BYTES <= page <= MAX_PAGE_SIZE_BYTES) or page & (page - 1):
            raise InvalidArgument(
                f"page size {page} must be a power of two from 1K to 256M: try 64K (the default)"
            )
        if self.size_bytes < page:
            raise InvalidArgument(
                f"pool size {self.size_bytes} bytes is smaller than one page ({page} bytes): "
                "give a larger size or a smaller page size"
            )
        get_policy(self.policy)  # raises with the list of valid names
        object.__setattr__(self, "size_bytes", self.num_pages * page)
        inline = self.inline_bytes
        if inline and not (
            INLINE_ALIGN_BYTES <= inline <= min(MAX_INLINE_BYTES, page // 2)
            and inline % INLINE_ALIGN_BYTES == 0
        ):
            raise InvalidArgument(
                f"inline bytes must be 0 or a multiple of {INLINE_ALIGN_BYTES} from "
                f"{INLINE_ALIGN_BYTES} to {min(MAX_INLINE_BYTES, page // 2)} (half a page, "
                f"at most {MAX_INLINE_BYTES}), got {inline}: try 128"
            )
        if self.max_entries == 0:
            object.__setattr__(self, "max_entries", self.num_pages)
        most = MAX_INLINE_ENTRIES if inline else self.num_pages
        if not 1 <= self.max_entries <= most:
            raise InvalidArgument(
                f"max entries must be from 1 to {most}, got {self.max_entries}: "
                + (
                    "entries with inline slots need no page of their own"
                    if inline
                    else f"each entry takes at least one of the pool's {self.num_pages} pages "
                    "unless the pool has inline slots (--inline-bytes)"
                )
            )
        if self.lfu_half_life == 0:
            object.__setattr__(self, "lfu_half_life", self.max_entries)
        if self.lfu_half_life < 1:
            raise InvalidArgument(f"lfu half-life must be positive, got {self.lfu_half_life}")
        if self.default_ttl_s is not None and not (
            math.isfinite(self.default_ttl_s) and self.default_ttl_s > 0
        ):
            raise InvalidArgument(f"default ttl must be positive seconds, got {self.default_ttl_s}")
        if not 1 <= self.eviction_samples <= 1 << 16:
            raise InvalidArgument(f"eviction samples must be 1..65536, got {self.eviction_samples}")
        if not 1 <= self.max_processes <= 1 << 20:
            raise InvalidArgument(f"max processes must be 1..1048576, got {self.max_processes}")

    @property
    def slots_bytes(self) -> int:
        """The room the inline slots take beside the pages: every entry slot's (0 without)."""
        return self.max_entries * self.inline_bytes

    @property
    def capacity_bytes(self) -> int:
        """The room entries' bytes have: the pages and the inline slots."""
        return self.size_bytes + self.slots_bytes

    @property
    def counts_requests(self) -> bool:
        """Whether the pool's policy counts requests, which lays out a sketch for them."""
        from .policies import get_policy  # as in __post_init__

        return get_policy(self.policy).counts_requests

    @property
    def num_pages(self) -> int:
        """Data pages in the pool."""
        return self.size_bytes // self.page_size_bytes

    @classmethod
    def build(
        cls,
        size: str | int,
        *,
        page_size: str | int = DEFAULT_PAGE_SIZE_BYTES,
        policy: str = "lru",
        max_entries: int | None = None,
        default_ttl: str | float | None = None,
        eviction_samples: int = DEFAULT_EVICTION_SAMPLES,
        lfu_half_life: int | None = None,
        max_processes: int = DEFAULT_MAX_PROCESSES,
        inline_bytes: str | int = 0,
    ) -> PoolConfig:
        """Build a config from human inputs (``"16G"``, ``"64K"``, ``"1h"``)."""
        if not isinstance(policy, str):
            raise InvalidArgument(f"policy must be a name such as 'lru', not {policy!r}")
        if max_entries is not None:
            whole_number(max_entries, "max entries", low=1)
        if lfu_half_life is not None:
            whole_number(lfu_half_life, "lfu half-life", low=1)
        return cls(
            size_bytes=parse_size(size, what="pool size"),
            page_size_bytes=parse_size(page_size, what="page size"),
            policy=policy.lower(),
            max_entries=max_entries or 0,
            default_ttl_s=None if default_ttl is None else parse_duration(default_ttl, what="ttl"),
            eviction_samples=eviction_samples,
            lfu_half_life=lfu_half_life or 0,
            max_processes=max_processes,
            inline_bytes=(
                0 if inline_bytes in (0, "0") else parse_size(inline_bytes, what="inline bytes")
            ),
        )

    @classmethod
    def from_stored(cls, record: np.ndarray | np.void, size_bytes: int) -> PoolConfig:
        """Rebuild from a stored header (a pool segment's or a snapshot's) with these field names.

        Raises:
            InvalidArgument: a stored value is out of range.
            UnicodeDecodeError: the stored policy name is not text.
        """
        ttl = float(record["default_ttl_s"])
        names = record.dtype.names or ()
        return cls(
            size_bytes=size_bytes,
            page_size_bytes=int(record["page_size_bytes"]),
            policy=np.asarray(record["policy"]).item().decode("ascii"),
            max_entries=int(record["max_entries"]),
            default_ttl_s=ttl if ttl > 0 else None,
            eviction_samples=int(record["eviction_samples"]),
            lfu_half_life=int(record["lfu_half_life"]),
            max_processes=int(record["max_processes"]),
            inline_bytes=int(record["inline_bytes"]) if "inline_bytes" in names else 0,
        )

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON output and reports."""
        return dataclasses.asdict(self)
