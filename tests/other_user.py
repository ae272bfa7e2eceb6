"""Run code as another real user: a forked child that drops to ``nobody``.

Imported by tests in this folder and in ``multiprocess/`` (pytest puts the
folder of ``conftest.py`` on ``sys.path``). Needs root, as CI runs; tests that
use it skip elsewhere (``needs_root``).

The child is forked rather than started: the interpreter and its standard
library live under /root here, which ``nobody`` cannot read, so everything the
child runs must already be imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

NOBODY = 65534
"""uid and gid of ``nobody`` (and ``nogroup``) on Debian and Ubuntu."""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to become another user; CI runs as root"
)


def run_as_nobody(work: Callable[[], int], gid: int = NOBODY) -> tuple[int, str, str]:
    """``work()`` in a child running as user ``nobody`` and group ``gid``.

    Returns:
        (its return value as the exit code, its stdout, its stderr).
    """
    (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            sys.stdout = os.fdopen(out_write, "w")  # pytest replaced the originals
            sys.stderr = os.fdopen(err_write, "w")
            os.setgroups([])
            os.setgid(gid)
            os.setuid(NOBODY)
            code = work()
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(out_write)
    os.close(err_write)
    with os.fdopen(out_read) as out, os.fdopen(err_read) as err:
        stdout, stderr = out.read(), err.read()  # stdout to its end: stderr is a line at most
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, stderr
