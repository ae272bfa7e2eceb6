"""The pool side of the proxy: slot states by token prefix, and what went wrong, counted.

Every call here is made so that no request fails because of the cache
(the issue's requirement 4): a pool that is missing, destroyed, full or
damaged, or any other error in it, is a miss or a skipped save, counted in
:class:`Problems` and logged once per kind. That is why these methods catch
``Exception`` rather than the errors they expect: an unexpected one must not
reach a client either.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from ... import lifecycle
from ...errors import PoolFullError
from ...pool import Pool
from ...prefix import StateCache, StateHit, StateLayout

log = logging.getLogger("kvcache.llama_server")

REOPEN_EVERY_S = 30.0
"""How often a proxy whose pool is missing tries to open it again."""

PROBLEMS = {
    "pool_unavailable": "the pool cannot be opened; requests run uncached",
    "pool_error": "the pool failed a read or write; that request runs uncached",
    "pool_full": "a state did not fit in the pool; it is not cached",
    "damaged_state": "a stored state did not check out; it is ignored",
    "tokenize_failed": "the server could not tokenize a request; it runs uncached",
    "busy": "every slot was busy and the line was full; a request ran unpinned, uncached",
    "restore_refused": "the server refused a stored state; that request runs uncached",
    "restore_ineffective": "a restored state was not reused (cache_n below what it held)",
    "stale_slot": "a slot did not hold what the proxy thought (cache_n below it)",
    "save_failed": "a slot's state could not be saved after a request",
}
"""Every kind of problem the proxy counts, with what it means for requests."""


_POOL_OWN = frozenset({"pool_unavailable", "pool_error", "pool_full"})
"""Problems not added to the pool's ``errors``: it has none, it failed, or it counted them."""


class Problems:
    """Counts of cache problems by kind; the first of each kind is logged as a warning.

    Problems of the proxy's own (a refused restore, a failed save) are also added
    to the pool's ``errors`` counter (``kvcache_errors_total``), through ``pool_sink``.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.pool_sink: Callable[[], None] | None = None

    def note(self, kind: str, detail: object) -> None:
        """Count a problem of ``kind`` (one of :data:`PROBLEMS`), logging the first."""
        self.counts[kind] += 1
        if self.pool_sink is not None and kind not in _POOL_OWN:
            self.pool_sink()
        level = logging.WARNING if self.counts[kind] == 1 else logging.DEBUG
        log.log(level, "%s (%s); further ones are counted, not logged", PROBLEMS[kind], detail)


class StateStore:
    """Slot states of one model and layout in a named pool, opened (again) on demand.

    Args:
        pool_name: the pool to use.
        model: the model's id (:func:`identity.model_digest`).
        layout: the server's settings (:func:`identity.layout`).
        chunk_tokens: tokens between prefix markers.
        problems: where failures are counted.
        opener: opens a pool by name (``kvcache.open``).
    """

    def __init__(
        self,
        pool_name: str,
        model: str,
        layout: StateLayout,
        *,
        chunk_tokens: int,
        problems: Problems,
        opener: Callable[[str], Pool] = lifecycle.open,
    ) -> None:
        self.pool_name = pool_name
        self.model = model
        self.layout = layout
        self.chunk_tokens = chunk_tokens
        self.problems = problems
        self._opener = opener
        self._states: StateCache | None = None
        self._next_open_s = 0.0

    def get(self, tokens: np.ndarray) -> StateHit | None:
        """The stored state sharing the longest prefix with ``tokens``; None on a miss or error."""
        states = self._open()
        if states is None:
            return None
        try:
            return states.get(tokens)
        except Exception as exc:
            self._failed(exc)
            return None

    def put(self, tokens: np.ndarray, data: bytes) -> bool:
        """Store a slot file's bytes under the tokens it holds; whether it was stored."""
        states = self._open()
        if states is None:
            return False
        try:
            states.put(tokens, [data])
        except Exception as exc:
            if isinstance(exc, PoolFullError):  # ValueTooLargeError too
                self.problems.note("pool_full", exc)
            else:
                self._failed(exc)
            return False
        return True

    def count_error(self) -> None:
        """Add one to the pool's ``errors`` counter, if the pool is open."""
        if self._states is not None:
            try:
                self._states.pool.count_error()
            except Exception as exc:
                log.debug("counting an error in pool %r: %s", self.pool_name, exc)

    def close(self) -> None:
        """Close the pool if it is open."""
        if self._states is not None:
            states, self._states = self._states, None
            states.pool.close()

    def _open(self) -> StateCache | None:
        if self._states is not None:
            return self._states
        now = time.monotonic()
        if now < self._next_open_s:
            return None
        self._next_open_s = now + REOPEN_EVERY_S
        try:
            pool = self._opener(self.pool_name)
            self._states = StateCache(pool, self.model, self.layout, chunk_tokens=self.chunk_tokens)
        except Exception as exc:
            self.problems.note("pool_unavailable", exc)
            return None
        log.info("caching slot states in pool %r", self.pool_name)
        return self._states

    def _failed(self, exc: Exception) -> None:
        """A pool call failed: count it, and open the pool afresh on a later request."""
        self.problems.note("pool_error", f"{type(exc).__name__}: {exc}")
        states, self._states = self._states, None
        if states is not None:
            try:
                states.pool.close()
            except Exception as close_exc:
                log.debug("closing pool %r after an error: %s", self.pool_name, close_exc)
