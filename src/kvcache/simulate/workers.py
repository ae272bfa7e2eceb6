"""Replay workers that die with the process that started them, whatever ends it.

A simulation's runs go to worker processes that may replay for minutes. They
must not outlive their parent: a worker left behind replays on, and holds its
scratch pool's memory, after the user has stopped ``simulate``.

- A worker asks the kernel for SIGKILL when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), the one way that covers a parent killed with
  SIGKILL, which runs no code of its own. It then checks that its parent is
  still the process that forked it: one that died before the ``prctl`` would
  never send the signal.
- A parent stopped by SIGINT or SIGTERM (which the command line turns into an
  exception, see ``kvcache.cli``) kills its workers before it returns, rather
  than waiting for their runs to end as ``ProcessPoolExecutor`` does on exit.
- A worker ignores SIGINT: Ctrl-C on a terminal reaches the whole process
  group, and the parent, which gets it too, stops them.
- The workers are forked (whatever the platform's default start method), so
  they are the parent's own children (a forkserver's children would outlive
  the parent by as long as the forkserver does) and inherit the trace without
  pickling it.

A worker's scratch pools leave nothing behind when it is killed: see
``replay`` (the file is removed as soon as it is mapped).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from ..deathsig import die_with_parent


@contextlib.contextmanager
def worker_pool(
    jobs: int, initializer: Callable[..., None], initargs: tuple[Any, ...]
) -> Iterator[ProcessPoolExecutor]:
    """A ``ProcessPoolExecutor`` of ``jobs`` forked workers bound to this process: each
    dies when it does, and all are killed if the block is left by an exception."""
    before = set(multiprocessing.active_children())
    workers = ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_start_worker,
        initargs=(os.getpid(), initializer, initargs),
    )
    try:
        yield workers
    except BaseException:
        # Forked workers all start at the first submit (none is started later), so the
        # children that appeared since are this pool's; ProcessPoolExecutor has no
        # public way to kill its workers before Python 3.14.
        for child in set(multiprocessing.active_children()) - before:
            child.kill()
        workers.shutdown(wait=True, cancel_futures=True)
        raise
    workers.shutdown(wait=True)


def _start_worker(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    die_with_parent(signal.SIGKILL, parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler, forked in
    initializer(*initargs)
