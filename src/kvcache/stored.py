"""Whole entries as they move between a pool and somewhere else.

Persist and restore move entries between a pool and a snapshot file; a chain
of pools moves them between tiers (spill down, promote up). All of them use
the same two halves of ``Pool``: ``read_entry`` gives an entry's metadata and
views of its bytes, and ``confirm`` says afterwards whether what was read is
still that entry, intact (the readers' seqlock); ``write_entry`` stores an
entry whose bytes a ``fill`` callback copies in, published only if ``fill``
says they are good. The bytes are copied once, from one place to the other,
never under the lock of the pool they come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class EntryRef(NamedTuple):
    """One version of an entry: its slot and the generation it had when read."""

    eid: int
    generation: int


@dataclass(frozen=True)
class StoredEntry:
    """An entry's metadata: what is needed to store its bytes elsewhere and read them back.

    Attributes:
        key: the key's bytes (``flags`` says whether it was text).
        flags: ``layout`` entry flags (key is text, value is an array).
        header_len, value_len: lengths of the value's codec header and payload,
            which follow the key in the entry's bytes.
        priority, expires_at: as given to ``Pool.put`` (``inf``: never expires).
        checksum: ``transfer.checksum`` of the bytes, as published.
        created, last_access, freq: policy history on the source's logical clock.
    """

    key: bytes
    flags: int
    header_len: int
    value_len: int
    priority: int
    expires_at: float
    checksum: int
    created: int = 0
    last_access: int = 0
    freq: float = 1.0

    @property
    def num_bytes(self) -> int:
        """Key, value header and payload."""
        return len(self.key) + self.header_len + self.value_len

    @classmethod
    def from_record(cls, key: bytes, record: np.void, checksum: int) -> StoredEntry:
        """From an entry-table or snapshot record (fields named as in ``layout.ENTRY_DTYPE``)."""
        return cls(
            key=key,
            flags=int(record["flags"]),
            header_len=int(record["header_len"]),
            value_len=int(record["value_len"]),
            priority=int(record["priority"]),
            expires_at=float(record["expires_at"]),
            checksum=checksum,
            created=int(record["created"]),
            last_access=int(record["last_access"]),
            freq=float(record["freq"]),
        )
