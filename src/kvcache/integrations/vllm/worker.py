"""The connector's worker side: copy the planned ranges between the pool and vLLM's blocks.

Loads run in ``start_load_kv``, before the forward reads the blocks; stores
in ``wait_for_save``, after the forward wrote them. A load retrieves the
prompt's chunks from the one holding its first planned token (the blocks
before it are vLLM's own prefix-cache hit; a chunk's key names the whole
prefix before it, so the chunks before are not read) into one host buffer,
then writes the planned blocks with one indexed copy per layer. Whatever the
pool no longer holds -- a chunk evicted, expired or damaged since the
scheduler's lookup -- is not written: its blocks are reported by
:meth:`WorkerSide.take_load_errors`, and vLLM recomputes them.

Stores leave the forward's critical path on the CPU: ``wait_for_save``
hands them to one background thread and returns, so the step's sampling,
its output and the scheduling of the next step go on while the planned
blocks are copied out and written to the pool. The blocks stay valid for
that long without holding them back from vLLM: a block freed when its
request finishes or is preempted is written again only by a later step, and
each step first calls ``handle_preemptions`` (vLLM's hook for connectors
with asynchronous saves, before anything overwrites a block), where
:meth:`WorkerSide.settle` waits for the stores in flight. So
``request_finished`` never delays a release, and ``get_finished`` has
nothing to report. On a GPU, stores stay synchronous: a copy from another
thread would also have to be ordered after the forward's stream, which no
device has tested here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

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
        self._storing: ThreadPoolExecutor | None = None
        self._in_flight: list[Future[None]] = []

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
        if plan.loads:
            self.settle()  # a chunk stored last step may be asked for now
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
        """Copy the planned blocks, just computed, into the pool (chunks it lacks):
        in the background on the CPU (see the module's doc), before returning on a GPU."""
        if not plan.stores:
            return
        if self._device.type != "cpu":
            for transfer in plan.stores:
                self._store(transfer)
            return
        if self._storing is None:
            self._storing = ThreadPoolExecutor(1, thread_name_prefix="kvcache-store")
        stores = list(plan.stores)
        self._in_flight.append(self._storing.submit(self._store_all, stores))

    def settle(self) -> None:
        """Wait for the stores in flight: before vLLM may write to their blocks again.

        Raises:
            Exception: what a store raised (as a synchronous store would have).
        """
        in_flight, self._in_flight = self._in_flight, []
        for future in in_flight:
            future.result()

    def shutdown(self) -> None:
        """Finish the stores in flight and stop the store thread."""
        self.settle()
        if self._storing is not None:
            self._storing.shutdown(wait=True)
            self._storing = None

    def take_load_errors(self) -> set[int]:
        """The blocks that failed to load since the last call (vLLM recomputes them)."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _store_all(self, transfers: list[Transfer]) -> None:
        for transfer in transfers:
            self._store(transfer)

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
