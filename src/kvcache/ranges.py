"""The values an entry's metadata may hold: what check(), repair and restore enforce.

Checksums prove that an entry's bytes and read fields are the ones written;
they say nothing of its policy metadata (clock values, use count, expiry,
priority), which change on every hit. A wild value there breaks later puts
and gets instead: a last access beyond the clock overflows LFU's decay, a
clock near 2**63 overflows its next tick, a NaN expiry is never reached. So
``recovery`` (on a live pool) and ``snapshot`` (on a file) test the same
ranges, vectorised over many records at once: a pool mends what only steers
eviction and drops what decides how bytes are read; a restore skips both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import KNOWN_FLAGS, PRIORITY_LIMIT, VALUE_IS_ARRAY

MAX_VALUE_HEADER_BYTES = 2 + 255 + 8 * 32
"""The longest value header ``kvcache.codec`` writes: ndim, dtype length, dtype, shape."""
MENDS = {"last_access", "created", "freq", "priority"}
"""Fields a repair puts back in range rather than dropping the entry: they only
steer eviction, and the entry's bytes are still what was written."""


@dataclass(frozen=True)
class Fault:
    """One way records break a range: which field, why, and which records."""

    field: str
    why: str
    bad: np.ndarray  # bool per record


def entry_faults(records: np.ndarray, clock: int) -> list[Fault]:
    """Every range that ``records`` (entry or snapshot records) break, given the clock.

    Args:
        records: structured records with ``flags``, ``header_len``,
            ``last_access``, ``created``, ``freq``, ``expires_at`` and ``priority``.
        clock: the logical clock that every clock value must not pass.
    """
    flags, freq, priority = records["flags"], records["freq"], records["priority"]
    is_array = (flags & VALUE_IS_ARRAY) != 0
    faults = [
        Fault("flags", "has unknown flags", (flags & ~KNOWN_FLAGS) != 0),
        Fault(
            "header_len",
            "its value header disagrees with its flags",
            is_array != (records["header_len"] > 0),
        ),
        Fault("expires_at", "its expiry time is not a number", np.isnan(records["expires_at"])),
        Fault(
            "freq",
            "its use count is not a finite count",
            ~np.isfinite(freq) | (np.nan_to_num(freq) < 0),
        ),
        Fault(
            "priority",
            "its priority is out of range",
            # not np.abs: it leaves -2**63 negative
            (priority >= PRIORITY_LIMIT) | (priority <= -PRIORITY_LIMIT),
        ),
    ]
    for field in ("last_access", "created"):
        values = records[field]
        faults.append(
            Fault(
                field,
                f"its {field} is outside the clock 0..{clock}",
                (values < 0) | (values > clock),
            )
        )
    return [fault for fault in faults if fault.bad.any()]


def mended(field: str, value: int | float, clock: int) -> int | float:
    """``value`` of a field in ``MENDS`` brought back in range."""
    if field == "freq":
        return 1.0  # as a fresh put: the count is lost, the entry is not
    if field == "priority":
        return max(-PRIORITY_LIMIT + 1, min(PRIORITY_LIMIT - 1, int(value)))
    return max(0, min(clock, int(value)))  # a clock value
