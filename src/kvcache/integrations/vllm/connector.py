"""``KVCacheConnector``: vLLM's v1 KV connector API over a kvcache pool.

vLLM builds the connector twice: once in its scheduler (``SchedulerSide``:
lookups and step plans) and once in each worker (``WorkerSide``: the copies).
Both open the same pool by name, so nothing passes between them but the
step plan vLLM carries. This class only routes vLLM's calls to the side
that was built; see those modules for what each does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.platforms import current_platform
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from .names import Caches, engine_kv, model_id
from .paged import PagedLayout
from .plan import StepPlan
from .scheduler import SchedulerSide
from .settings import ConnectorSettings
from .worker import WorkerSide

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class KVCacheConnector(KVConnectorBase_V1):
    """A vLLM KV connector that keeps prompt prefixes' KV in a kvcache pool.

    Configured through ``kv_connector_extra_config`` (see
    :class:`~kvcache.integrations.vllm.settings.ConnectorSettings`).

    Raises:
        InvalidArgument: at engine start, for bad settings or a model whose
            KV the connector cannot store exactly (see ``names.engine_kv``).
        PoolNotFoundError: the pool does not exist and no ``size`` was given.
    """

    _cache_hit_source = CacheHitSource.HOST

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        settings = ConnectorSettings.from_extra_config(
            self._kv_transfer_config.kv_connector_extra_config
        )
        engine = engine_kv(vllm_config, kv_cache_config, settings.chunk_tokens)
        caches = Caches(
            settings.open_pool(),
            model_id(vllm_config, settings.model_id),
            engine.layout,
            settings.chunk_tokens,
        )
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(caches, engine.block_size)
            _recompute_load_failures(self._kv_transfer_config)
        else:
            self._worker = WorkerSide(caches, engine, self.block_layout())

    def block_layout(self) -> PagedLayout:
        """Where K and V sit in a block of vLLM's cache on this platform (see ``paged``)."""
        return PagedLayout.ROWS if current_platform.is_cpu() else PagedLayout.HALVES

    # ------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Keep views of vLLM's per-layer caches (called once, after they are allocated)."""
        self._worker_side().register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Fill this step's planned blocks from the pool, before the forward."""
        self._worker_side().load(self._plan())

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: ``start_load_kv`` loads every layer before returning."""

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        """Nothing per layer: ``wait_for_save`` stores whole chunks once the forward is done."""

    def wait_for_save(self) -> None:
        """Store the chunks this step completed and the pool lacks (in the background on the
        CPU: settled in the next step's ``handle_preemptions``)."""
        if self.has_connector_metadata():
            self._worker_side().save(self._plan())

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Before this step writes to any block: finish the stores still reading blocks
        (those of a request finished or preempted may go to another request now)."""
        self._worker_side().settle()

    def shutdown(self) -> None:
        """Finish the stores in flight."""
        if self._worker is not None:
            self._worker.shutdown()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose chunks left the pool between lookup and load: vLLM recomputes them."""
        return self._worker_side().take_load_errors()

    # --------------------------------------------------------- scheduler side

    def on_new_request(self, request: Request) -> None:
        """Start tracking ``request`` (or say once why requests like it are not cached)."""
        self._scheduler_side().on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Tokens past ``num_computed_tokens`` that the pool holds; loaded synchronously."""
        return self._scheduler_side().num_new_matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Note the load vLLM accepted; its blocks arrive with the step's output."""
        self._scheduler_side().after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads and stores, for the workers."""
        return self._scheduler_side().build_plan(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; its blocks may be freed at once (a store still reading them
        finishes before the next step writes to any block)."""
        self._scheduler_side().request_finished(request)
        return False, None

    # ---------------------------------------------------------------- helpers

    def _plan(self) -> StepPlan:
        plan = self._get_connector_metadata()
        assert isinstance(plan, StepPlan)
        return plan

    def _worker_side(self) -> WorkerSide:
        assert self._worker is not None, "a worker-side call on the scheduler's connector"
        return self._worker

    def _scheduler_side(self) -> SchedulerSide:
        assert self._scheduler is not None, "a scheduler-side call on a worker's connector"
        return self._scheduler


def _recompute_load_failures(kv_transfer_config: Any) -> None:
    """Make vLLM recompute the blocks of chunks that left the pool before their load.

    vLLM's default, ``kv_load_failure_policy="fail"``, ends such a request with an
    error; for a cache, a chunk evicted between the lookup and the load is a miss.
    The scheduler reads the policy just after building its connector, so setting it
    here takes effect (and ``"fail"`` cannot be told from the default: it is replaced).
    """
    if kv_transfer_config.kv_load_failure_policy != "recompute":
        log.info(
            "kvcache connector: kv_load_failure_policy set to 'recompute': a chunk that "
            "leaves the pool between lookup and load is recomputed, not an error"
        )
        kv_transfer_config.kv_load_failure_policy = "recompute"
