"""Disk pools across restarts: warm when closed cleanly, repaired when not.

A pool in RAM is gone at reboot, and a process killed while using it is
handled by the lock's ``dirty`` word. A disk pool outlives both, and may
also be stopped in ways the lock cannot see: power lost with some changed
pages written back and others not, or a copy of the file taken while
processes wrote it. The header's ``clean`` word tells these apart::

    create           clean = 1   (an empty pool is consistent)
    every open       clean = 0, and if it was 1, the header page is written
                     to disk at once, before any later change can reach it
    first open       (no other process has it open) with clean == 0: the last
                     stop was unclean, so repair the metadata from the entry
                     table and re-reserve the reserved pages (a copy may be sparse)
    last close       flush (msync + fsync), then clean = 1, header written again

Data pages are never trusted after an unclean stop either: a disk pool
verifies every value it serves against the checksum written with it
(``Pool.verify_reads`` is forced on), and drops and counts a damaged entry
(``damaged``) instead of returning it. xxh3 sums 10+ GB/s, far faster than
the disk the pages come from.

Who else has the pool open comes from the process table's leases (``procs``),
which the kernel drops when a holder dies, so a SIGKILLed holder never
counts. Both checks run under the pool lock, so an open and a close never
both think they are alone.

"First open" means: no other live holder has *finished* opening (the slot's
second lease, ``ProcessTable.mark_opened``, taken under the lock at the end
of ``on_open``). A process counts as attached from the moment it claims its
slot, just before it first takes the lock, so two processes that open a pool
left unclean at the same moment would otherwise each see the other and
neither repair; now the first to take the lock repairs and the other sees
that it did.
"""

from __future__ import annotations

from collections.abc import Callable

from .layout import HEADER_BYTES, Geometry, H
from .procs import ProcessTable
from .segment import Segment


def mark_new(seg: Segment) -> None:
    """Mark a just-initialised disk pool clean, so its first open does not repair it."""
    if seg.on_disk:
        header = memoryview(seg.buffer)[:HEADER_BYTES].cast("q")
        header[H.clean] = 1
        header.release()


def on_open(
    seg: Segment,
    header_q: memoryview,
    procs: ProcessTable,
    slot: int,
    holder_fd: int,
    geometry: Geometry,
    repair: Callable[[], None],
) -> None:
    """Run by each new handle of a disk pool under the lock, with its process slot claimed.

    Raises:
        OutOfSharedMemoryError: the reserved pages cannot be reserved again (a
            copy of the pool on a disk too full for it).
    """
    if header_q[H.clean] == 0 and not procs.others_opened(slot):
        repair()
        reserved = geometry.data_offset + header_q[H.reserved_pages] * geometry.page_size_bytes
        seg.allocate(0, reserved)  # already promised to the pool: no memory check
    if header_q[H.clean] != 0:
        header_q[H.clean] = 0
        seg.flush_header()
    procs.mark_opened(holder_fd, slot)


def on_close(seg: Segment, header_q: memoryview, procs: ProcessTable, slot: int) -> bool:
    """Under the lock, while closing: if no other handle has the pool open, flush it and
    mark it clean; return whether it did (the caller then writes the header page)."""
    if procs.others_live(slot):
        return False
    seg.flush()  # what others wrote since this handle's unlocked flush, if anyone did
    header_q[H.clean] = 1
    return True
