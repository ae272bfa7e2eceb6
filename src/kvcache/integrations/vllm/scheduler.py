"""The connector's scheduler side: how much of a prompt the pool holds, and the step plans.

It never copies KV. For each request it answers vLLM's question "how many
more tokens can you load?" with one ``PrefixCache.lookup`` (a presence check
with no side effects, as vLLM may ask again), then, each step, plans the
loads vLLM accepted and the stores of the chunks this step completes. A
prompt's chained keys are hashed once, at its first lookup, and kept until
the request finishes: vLLM asks again each step a request waits (for room,
or after a preemption).

A load starts where vLLM's own computed tokens end (its prefix cache's
hit): the worker reads the pool from the chunk holding that token on, and
writes only the blocks after it.

Never wrong KV: a hit never covers the prompt's last token (vLLM computes
it to get the first new token's logits), so it is capped to the whole
blocks below it; a chunk-rounded hit is already whole blocks (chunks are
whole blocks, ``names.engine_kv`` checks). Only prompt tokens are stored,
each chunk once per request: ``stored`` moves forward as chunks are planned,
so a chunked prefill stores each chunk in the step that completes it, and a
request resumed after preemption stores nothing twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .names import Caches, request_salt, why_not_named
from .plan import StepPlan, Transfer

log = logging.getLogger(__name__)


@dataclass
class _Tracked:
    """A request the connector names: its prompt, blocks and progress."""

    prompt: list[int]
    salt: str | None
    keys: list[str] | None = None
    """The prompt's chunk keys, hashed at the first lookup."""
    found: int = 0
    """Prompt tokens the pool held at the last lookup (whole chunks)."""
    local: int = 0
    """Tokens vLLM had computed itself at the last lookup (its own prefix cache)."""
    stored: int = 0
    """Prompt tokens known to be in the pool, or planned to be stored."""
    block_ids: list[int] | None = None
    loading: int = 0
    """Tokens vLLM accepted to load, not yet planned."""


class SchedulerSide:
    """Lookups and step plans, in vLLM's scheduler process."""

    def __init__(self, caches: Caches, block_size: int) -> None:
        self._caches = caches
        self._block_size = block_size
        self._requests: dict[str, _Tracked] = {}
        self._warned: set[str] = set()

    def on_new_request(self, request: Any) -> None:
        """Track ``request`` if its KV can be named by its tokens; say once why not."""
        reason = why_not_named(request)
        if reason is not None:
            if reason not in self._warned:
                self._warned.add(reason)
                log.warning("kvcache connector: requests with %s are not cached", reason)
            return
        self._requests[request.request_id] = _Tracked(
            list(request.prompt_token_ids), request_salt(request)
        )

    def num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> int:
        """Tokens past ``num_computed_tokens`` whose KV the pool holds, whole blocks below the last.

        Only the lookup's result is remembered (for the store plan): asked again,
        it answers again from the pool.
        """
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            return 0
        block = self._block_size
        cap = min((request.num_tokens - 1) // block * block, len(tracked.prompt))
        pc = self._caches.get(tracked.salt)
        if tracked.keys is None:
            tracked.keys = pc.chunk_keys(tracked.prompt)
        tracked.found = pc.lookup_keys(tracked.keys[: cap // self._caches.chunk_tokens])
        tracked.local = num_computed_tokens
        return max(0, tracked.found - num_computed_tokens)

    def after_alloc(self, request: Any, num_external_tokens: int) -> None:
        """Note the load vLLM accepted (planned with the request's blocks next step)."""
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            return
        tracked.stored = max(tracked.stored, tracked.found)
        tracked.loading = num_external_tokens
        # the pool's token counters: the worker's retrieve counts the tokens it asks for
        # (from the chunk holding vLLM's first uncomputed token to the load's end, ``found``)
        # and their hits; the rest of the prompt here
        first = tracked.local // self._caches.chunk_tokens * self._caches.chunk_tokens
        asked = tracked.found - first if num_external_tokens else 0
        self._caches.pool.count_tokens(self._caches.model, queried=len(tracked.prompt) - asked)

    def build_plan(self, scheduler_output: Any) -> StepPlan:
        """This step's loads and stores."""
        plan = StepPlan()
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._requests.get(new.req_id)
            if tracked is not None:
                tracked.block_ids = list(new.block_ids[0])
                computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            tracked = self._requests.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[index]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks is not None:
                assert tracked.block_ids is not None
                tracked.block_ids.extend(new_blocks[0])
            computed[req_id] = cached.num_computed_tokens[index]
        for req_id, num_computed in computed.items():
            tracked = self._requests[req_id]
            if tracked.loading:
                plan.loads.append(self._load(req_id, tracked, num_computed))
            num_scheduled = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            store = self._store(req_id, tracked, num_computed + num_scheduled)
            if store is not None:
                plan.stores.append(store)
        return plan

    def request_finished(self, request: Any) -> None:
        """Forget ``request``."""
        self._requests.pop(request.request_id, None)

    def _load(self, req_id: str, tracked: _Tracked, num_computed: int) -> Transfer:
        """Load the accepted tokens, which end where vLLM's computed tokens now end."""
        start = num_computed - tracked.loading
        tracked.loading = 0
        return self._transfer(req_id, tracked, start, num_computed)

    def _store(self, req_id: str, tracked: _Tracked, computed_after: int) -> Transfer | None:
        """Store the prompt's chunks that this step completes, if the pool lacks them."""
        chunk = self._caches.chunk_tokens
        upto = min(computed_after, len(tracked.prompt)) // chunk * chunk
        if upto <= tracked.stored:
            return None
        start, tracked.stored = tracked.stored, upto
        return self._transfer(req_id, tracked, start, upto)

    def _transfer(self, req_id: str, tracked: _Tracked, start: int, end: int) -> Transfer:
        assert tracked.block_ids is not None
        block = self._block_size
        blocks = tracked.block_ids[start // block : end // block]
        return Transfer(req_id, tracked.salt, tracked.prompt[:end], start, blocks)
