"""Child processes that die with their parent (Linux's ``PR_SET_PDEATHSIG``).

``simulate``'s replay workers and the llama-server the proxy starts must not
outlive the process that started them, however it dies (SIGKILL included):
they hold memory, scratch pools and ports. libc is loaded here, at import,
never in the child: between fork and exec (``preexec_fn``) a child of a
threaded process must not ``dlopen`` (another thread may have held the
loader's lock at the fork).
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def die_with_parent(signum: int, parent: int | None = None) -> None:
    """Have the kernel send this process ``signum`` when its parent dies; with ``parent``
    (the pid it was forked from), exit now if that parent is already gone.

    Raises:
        OSError: the kernel refused the request.
    """
    if _LIBC is not None and _LIBC.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # orphaned before the prctl: no signal would come
