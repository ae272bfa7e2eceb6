"""The connector's worker side: copy the planned ranges between the pool and vLLM's blocks.

Loads run in ``start_load_kv``, before the forward reads the blocks; stores
in ``wait_for_save``, after the forward wrote them. A load retrieves the
prompt's chunks from the one holding its first planned token (the blocks
before it are vLLM's own prefix-cache hit; a chunk's key names the whole
prefix before it, so the chunks before are not read) into one host buffer,
then writes the planned blocks with one indexed copy per layer. Whatever the
pool no longer holds -- a chunk evicted, expired or damaged since the
scheduler's lookup -- is not written:
its blocks are reported by :meth:`WorkerSide.take_load_errors`, and vLLM
recomputes them.

Stores are synchronous: vLLM may reuse a finished request's blocks as soon
as the step ends, and holding them past it would need the connector to
delay their release (``request_finished`` returning True), left for later.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from ..devices import host_buffer, store_through_host
from .names import Caches, EngineKV
from .paged import PagedLayout, gather, kernel_block_ids, scatter, split_view
from .plan import StepPlan, Transfer

log = logging.getLogger(__name__)


class WorkerSide:
    """Loads and stores of one worker, over the layers vLLM registered."""

    def __init__(self, caches: Caches, engine: EngineKV, layout: PagedLayout) -> None:
        self._caches = caches
        self._engine = engine
        self._paged_layout = layout
        self._views: list[torch.Tensor] = []
        self._ratio = 1
        self._device = torch.device("cpu")
        self._load_errors: set[int] = set()

    def register(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Keep a block view of each attention layer's cache, in the pool's layer order."""
        head_dim = self._engine.layout.head_dim
        self._views = [
            split_view(kv_caches[name], self._paged_layout, head_dim)
            for name in self._engine.layer_names
        ]
        first = self._views[0]
        self._device = first.device
        self._ratio = self._engine.block_size // first.shape[3]

    def load(self, plan: StepPlan) -> None:
        """Fill the planned blocks from the pool; note those it could not fill."""
        for transfer in plan.loads:
            pc = self._caches.get(transfer.salt)
            tokens = np.asarray(transfer.token_ids, dtype=np.int64)
            first = transfer.start // pc.chunk_tokens * pc.chunk_tokens
            host = host_buffer(pc, transfer.end - first, self._device)
            _, hit = pc.retrieve(tokens, out=host, first_token=first)
            block = self._engine.block_size
            loaded = max(0, min(hit, transfer.end) - transfer.start) // block
            if loaded:
                blocks = self._kernel_ids(transfer.block_ids[:loaded])
                skipped = transfer.start - first  # of the chunk's tokens, those vLLM has
                scatter(host[skipped : skipped + loaded * block], self._views, blocks, self._device)
            missing = transfer.block_ids[loaded:]
            if missing:
                log.warning(
                    "kvcache connector: request %s: %d of %d planned blocks left the pool "
                    "before loading; vLLM recomputes them",
                    transfer.request_id, len(missing), len(transfer.block_ids),
                )  # fmt: skip
                self._load_errors.update(missing)

    def save(self, plan: StepPlan) -> None:
        """Copy the planned blocks, just computed, into the pool (chunks it lacks)."""
        for transfer in plan.stores:
            self._store(transfer)

    def take_load_errors(self) -> set[int]:
        """The blocks that failed to load since the last call (vLLM recomputes them)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _store(self, transfer: Transfer) -> None:
        blocks = self._kernel_ids(transfer.block_ids)
        store_through_host(
            self._caches.get(transfer.salt),
            np.asarray(transfer.token_ids, dtype=np.int64),
            transfer.start,
            self._device,
            lambda host: gather(host, self._views, blocks),
        )

    def _kernel_ids(self, block_ids: list[int]) -> list[int]:
        return kernel_block_ids(block_ids, self._ratio)
