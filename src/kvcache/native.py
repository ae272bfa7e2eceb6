"""kvcache's compiled parts, where the install built them.

The C extension is optional: ``pip install`` builds it where a C compiler is
found and goes on without it where none is. Every compiled function has a
pure-Python twin that gives the same result byte for byte, so a pool written by
a process with the extension is read by one without, and the other way round.
``KVCACHE_PURE_PYTHON=1`` in the environment takes the pure-Python path even
where the extension is built (the tests run both).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

SumAndCopy = Callable[[Sequence[Any], Sequence[Any], Sequence[Any]], int]


def _forced_pure() -> bool:
    return os.environ.get("KVCACHE_PURE_PYTHON", "") not in ("", "0")


def _load() -> SumAndCopy | None:
    if _forced_pure():
        return None
    try:
        from ._copysum import sum_and_copy
    except ImportError:
        return None
    return sum_and_copy  # type: ignore[no-any-return]


def _load_finder() -> Any:
    if _forced_pure():
        return None
    try:
        from ._lookup import Finder
    except ImportError:
        return None
    return Finder


def _load_poollock() -> Any:
    if _forced_pure():
        return None
    try:
        return importlib.import_module("._poollock", __package__)
    except ImportError:
        return None


sum_and_copy: SumAndCopy | None = _load()
"""``sum_and_copy(summed, sources, targets)``: the XXH3-64 of the buffers ``summed``
then ``sources``, copying ``sources`` back to back into ``targets`` in the same pass
(None: not built, or ``KVCACHE_PURE_PYTHON`` is set)."""

Finder: Any = _load_finder()
"""``kvcache._lookup.Finder``, a get's hit in C (built for one segment by
``kvcache.fastpath``); None: not built, or ``KVCACHE_PURE_PYTHON`` is set."""


poollock: Any = _load_poollock()
"""``kvcache._poollock``, the pool lock's futex word (``kvcache.lock``); None: not built,
or ``KVCACHE_PURE_PYTHON`` is set (the lock then takes flock only)."""


def engine() -> str:
    """Which path this process takes: ``"compiled"`` or ``"pure-python"`` (for reports)."""
    return "pure-python" if sum_and_copy is None and Finder is None else "compiled"
