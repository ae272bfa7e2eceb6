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
SumAndJoin = Callable[[Sequence[Any], Sequence[Any]], tuple[int, bytes]]


def _forced_pure() -> bool:
    return os.environ.get("KVCACHE_PURE_PYTHON", "") not in ("", "0")


def _module(module: str) -> Any:
    """``kvcache.<module>``, or None (not built, or ``KVCACHE_PURE_PYTHON`` is set)."""
    if _forced_pure():
        return None
    try:
        return importlib.import_module(f".{module}", __package__)
    except ImportError:
        return None


def _compiled(module: str, name: str) -> Any:
    """``kvcache.<module>.<name>``, or None (not built, built before ``name`` was added,
    or ``KVCACHE_PURE_PYTHON`` is set)."""
    return getattr(_module(module), name, None)


sum_and_copy: SumAndCopy | None = _compiled("_copysum", "sum_and_copy")
"""``sum_and_copy(summed, sources, targets)``: the XXH3-64 of the buffers ``summed``
then ``sources``, copying ``sources`` back to back into ``targets`` in the same pass
(None: not built, or ``KVCACHE_PURE_PYTHON`` is set)."""

sum_and_stream: SumAndCopy | None = _compiled("_copysum", "sum_and_stream")
"""``sum_and_stream(summed, sources, targets)``: ``sum_and_copy`` for targets not read again
soon (a put's pages): from 64 KiB up the copy goes round the CPU's cache (None: not built,
or ``KVCACHE_PURE_PYTHON`` is set)."""

sum_and_join: SumAndJoin | None = _compiled("_copysum", "sum_and_join")
"""``sum_and_join(summed, sources)``: ``sum_and_copy`` into a new ``bytes``, answered with
the sum as ``(sum, bytes)`` (None: not built, or ``KVCACHE_PURE_PYTHON`` is set)."""

copy: Callable[[Sequence[Any], Sequence[Any]], None] | None = _compiled("_copysum", "copy")
"""``copy(sources, targets)``: ``sources`` back to back into ``targets``, without the
sum, and without memcpy's slow case where a target lies a few bytes past its source
modulo a page (``_native/copybytes.h``); the GIL is released for large copies (None: not
built, or ``KVCACHE_PURE_PYTHON`` is set)."""

Finder: Any = _compiled("_lookup", "Finder")
"""``kvcache._lookup.Finder``, a get's hit in C (built for one segment by
``kvcache.fastpath``); None: not built, or ``KVCACHE_PURE_PYTHON`` is set."""

draw: Callable[[Any, Any, Any], None] | None = _compiled("_lookup", "draw")
"""``draw(live, words, ids)``: ``ids[:] = live[words % len(live)]`` (int64 ``live`` and
``ids``, uint64 ``words``), an eviction sample's ids in one pass (None: not built, or
``KVCACHE_PURE_PYTHON`` is set)."""

reads_without_lock: bool = bool(_compiled("_lookup", "UNLOCKED_READS"))
"""Whether ``Finder.read`` and ``Finder.present`` can answer without the pool's lock on
this platform (x86-64, see ``kvcache._lookup``); elsewhere they always answer None."""


poollock: Any = _module("_poollock")
"""``kvcache._poollock``, the pool lock's futex word (``kvcache.lock``); None: not built,
or ``KVCACHE_PURE_PYTHON`` is set (the lock then takes flock only)."""


def engine() -> str:
    """Which path this process takes: ``"compiled"`` or ``"pure-python"`` (for reports)."""
    return "pure-python" if sum_and_copy is None and Finder is None else "compiled"
