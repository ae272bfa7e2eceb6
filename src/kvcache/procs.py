"""Process identity and liveness, robust to pid reuse.

A process is identified by its pid and its start time (clock ticks since boot,
from ``/proc/<pid>/stat``), so a recycled pid is never mistaken for the
process that died. Liveness is what crash recovery asks of the owner of a
half-written entry, and what ``stats().attached`` reports.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import PoolFullError


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of ``/proc/<pid>/stat`` (state first), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may itself contain spaces and ')'.
    return stat[stat.rindex(b")") + 2 :].split()


def start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (field 22), or -1 if it does not exist."""
    fields = _stat_fields(pid)
    return -1 if fields is None else int(fields[19])


_me: tuple[int, int] = (-1, -1)


def me() -> tuple[int, int]:
    """This process's (pid, start time), refreshed after ``fork``."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:
        _me = (pid, start_time(pid))
    return _me


_PF_EXITING = 0x4
"""Kernel task flag (stat field 9), set as soon as a process starts to exit: it
closes its files (dropping its ``flock``) before it becomes a zombie, so the next
lock holder can see a dying holder still in state R."""


def is_alive(pid: int, start: int) -> bool:
    """Whether the process that had ``pid`` and ``start`` still runs (exiting or zombie: dead)."""
    fields = _stat_fields(pid) if pid > 0 else None
    return (
        fields is not None
        and fields[0] not in (b"Z", b"X")
        and not int(fields[6]) & _PF_EXITING
        and int(fields[19]) == start
    )


class ProcessTable:
    """The attached processes, a (pid, start) pair per slot in the segment."""

    def __init__(self, table: np.ndarray) -> None:
        self._table = table

    def attach(self, pid: int, start: int) -> None:
        """Record a process, pruning dead ones to make room.

        Raises:
            PoolFullError: every slot holds a live process.
        """
        self.prune()
        free = np.flatnonzero(self._table["pid"] == 0)
        if not free.size:
            raise PoolFullError(
                f"{len(self._table)} live processes already use this pool: close some "
                "or recreate the pool with a larger max_processes"
            )
        self._table[free[0]] = (pid, start)

    def detach(self, pid: int, start: int) -> None:
        """Forget one attachment of a process (it may hold the pool open more than once)."""
        table = self._table
        mine = np.flatnonzero((table["pid"] == pid) & (table["start"] == start))
        if mine.size:
            table[mine[0]] = (0, 0)

    def prune(self) -> None:
        """Forget processes that are no longer running."""
        for slot in np.flatnonzero(self._table["pid"] != 0):
            pid, start = (int(x) for x in self._table[slot])
            if not is_alive(pid, start):
                self._table[slot] = (0, 0)

    def live_pids(self) -> list[int]:
        """Pids of attached processes that are still running, sorted, each once."""
        return sorted(
            {
                int(pid)
                for pid, start in self._table[self._table["pid"] != 0]
                if is_alive(int(pid), int(start))
            }
        )
