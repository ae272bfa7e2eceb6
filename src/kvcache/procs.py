"""The attached-process table: who has a pool open, judged alive by the kernel.

Every open ``Pool`` holds one slot of the table (an observer, which only
looks, holds none: see ``kvcache.open``). It owns the slot by holding
the slot's lease (an OFD lock on the slot's first byte, see ``leases``)
through a file description of its own, and the kernel drops the lease when
the process dies, in whatever PID namespace it ran. So a slot's holder is
alive exactly while its lease is held; nothing else is trusted.

The lease is held through the same description as the pool lock's ``flock``.
When a description is closed the kernel removes its OFD locks before its
flock (``locks_remove_file``), so a process that takes the pool lock after
its holder died always finds that holder's lease gone, and the repair it
runs drops the dead holder's half-written entries at once. Leases are probed
through another description (a lock's own holder never conflicts with it). Pids and
start times are kept beside it for people only (``kvcache status``):
a pid from another namespace means nothing, or another process, here.

A slot's ``serial`` is bumped by each new holder, so a record that names its
writer as (slot, serial) is never mistaken for the work of a later holder of
the same slot. The pool lock's word names its owner the same way (with the
serial's low 32 bits: ``is_live_owner``), and a waiter judges it by this
lease. Claiming needs no pool lock: the kernel grants a lease to one claimant
only, and only the holder writes its slot.

Slot layout (``layout.PROC_DTYPE``, 32 bytes)::

    +--------+--------+--------+--------+
    | serial |  pid   | start  | pid_ns |   lease: byte 0 of the slot
    +--------+--------+--------+--------+   opened: byte 1 (see durable)

A second lease, on byte 1, says the holder's open has finished (``mark_opened``):
a disk pool's first opener repairs it after an unclean stop, and a holder
whose open is still under way must not count as one that already checked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import leases
from .errors import PoolFullError
from .layout import PROC_DTYPE


@dataclass(frozen=True)
class Identity:
    """How a process shows itself in the table (display only, never for liveness)."""

    pid: int
    start: int  # clock ticks since boot (field 22 of /proc/<pid>/stat)
    pid_ns: int  # inode of its PID namespace


def _start_time(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # The command name (field 2) may itself contain spaces and ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 1  # no /proc: one namespace as far as anyone here can tell


_me: Identity | None = None


def me() -> Identity:
    """This process's identity, refreshed after ``fork``."""
    global _me
    pid = os.getpid()
    if _me is None or _me.pid != pid:
        _me = Identity(pid, _start_time(pid), _pid_namespace())
    return _me


class ProcessTable:
    """The slots of one segment's process table.

    Args:
        table: the numpy view of the table in the mapping.
        offset: where the table starts in the segment file.
        probe_fd: a description of the segment that never holds a slot's lease,
            through which the leases of others are tested.
    """

    def __init__(self, table: np.ndarray, offset: int, probe_fd: int) -> None:
        self._table = table
        self._offset = offset
        self._probe_fd = probe_fd

    def _lease_byte(self, slot: int) -> int:
        return self._offset + slot * PROC_DTYPE.itemsize

    def claim(self, holder_fd: int) -> tuple[int, int]:
        """Take a free slot through ``holder_fd`` (a description of the caller's own).

        Returns:
            (slot, serial): how this holder's records name it.

        Raises:
            PoolFullError: every slot is held by a live process.
        """
        table = self._table
        # Slots cleared by a clean close first, then those of processes that died.
        order = np.argsort(table["pid_ns"] != 0, kind="stable")
        for slot in order.tolist():
            if leases.try_hold(holder_fd, self._lease_byte(slot)):
                serial = int(table["serial"][slot]) + 1
                who = me()
                table[slot] = (serial, who.pid, who.start, who.pid_ns)
                return slot, serial
        raise PoolFullError(
            f"{len(table)} live processes already use this pool: close some "
            "or recreate the pool with a larger max_processes"
        )

    def pid_of(self, slot: int) -> int:
        """The pid its last holder gave (display only: in that holder's PID namespace)."""
        return int(self._table["pid"][slot]) if 0 <= slot < len(self._table) else 0

    def leave(self, holder_fd: int, slot: int) -> None:
        """Clear a slot this holder owns and give up its leases."""
        self._table[slot] = (self._table["serial"][slot], 0, 0, 0)
        leases.release(holder_fd, self._lease_byte(slot) + 1)
        leases.release(holder_fd, self._lease_byte(slot))

    def mark_opened(self, holder_fd: int, slot: int) -> None:
        """Say that this holder's open finished (its slot's second lease)."""
        leases.try_hold(holder_fd, self._lease_byte(slot) + 1)

    def others_opened(self, slot: int) -> bool:
        """Whether a live holder other than the one of ``slot`` has finished its open."""
        return self._any_held(slot, at=1)

    def is_live(self, slot: int, serial: int) -> bool:
        """Whether the holder that took ``slot`` as ``serial`` still runs."""
        return (
            0 <= slot < len(self._table)
            and int(self._table["serial"][slot]) == serial
            and leases.is_held(self._probe_fd, self._lease_byte(slot))
        )

    def is_live_owner(self, slot: int, serial_low: int) -> bool:
        """``is_live`` for a pool lock word's owner, which keeps the low 32 bits of the serial."""
        serial = int(self._table["serial"][slot]) if 0 <= slot < len(self._table) else -1
        return serial & 0xFFFFFFFF == serial_low and self.is_live(slot, serial)

    def others_live(self, slot: int) -> bool:
        """Whether a live holder other than the one of ``slot`` has a slot (this process's
        other handles of the pool count: each holds a slot of its own)."""
        return self._any_held(slot, at=0)

    def _any_held(self, slot: int, *, at: int) -> bool:
        used = np.flatnonzero(self._table["pid_ns"] != 0).tolist()
        return any(
            leases.is_held(self._probe_fd, self._lease_byte(other) + at)
            for other in used
            if other != slot
        )

    def live(self) -> list[Identity]:
        """Identities of the live holders, each process once, sorted by pid."""
        table = self._table
        found = {
            Identity(int(table["pid"][slot]), int(table["start"][slot]), int(table["pid_ns"][slot]))
            for slot in np.flatnonzero(table["pid_ns"] != 0).tolist()
            if leases.is_held(self._probe_fd, self._lease_byte(slot))
        }
        return sorted(found, key=lambda who: (who.pid_ns, who.pid))
