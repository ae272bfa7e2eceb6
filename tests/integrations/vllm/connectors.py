"""Connectors that go wrong on purpose, loaded by vLLM as ``kv_connector_module_path``
``connectors`` (this folder is on the engines' PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from typing import Any

import kvcache
from kvcache import transfer
from kvcache.integrations.vllm import KVCacheConnector
from kvcache.integrations.vllm.names import engine_kv, model_id
from kvcache.integrations.vllm.paged import PagedLayout
from kvcache.integrations.vllm.settings import ConnectorSettings
from kvcache.prefix import PrefixCache


class WrongLayoutConnector(KVCacheConnector):
    """Reads and writes vLLM's CPU blocks as if they were flash attention's: the
    negative control of the output comparisons (wrong KV must change the output)."""

    def block_layout(self) -> PagedLayout:
        return PagedLayout.HALVES


class CrashingConnector(KVCacheConnector):
    """SIGKILLs its own process in the middle of copying the third chunk into the pool:
    after its key, header and half its KV (``CRASH_AT_PUT``: which put; default 3)."""

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        scatter, scatter_summed = transfer.scatter, transfer.scatter_summed
        puts = {"count": 0}
        crash_at = int(os.environ.get("CRASH_AT_PUT", "3"))

        def die_if_due(targets: list[Any], pieces: tuple[Any, ...]) -> None:
            puts["count"] += 1
            if puts["count"] == crash_at:
                torn = bytes(pieces[-1])[: len(pieces[-1]) // 2]
                scatter(targets, (*pieces[:-1], torn))
                os.kill(os.getpid(), signal.SIGKILL)

        def scatter_then_die(targets: list[Any], pieces: tuple[Any, ...]) -> None:
            die_if_due(targets, pieces)  # a small value, copied under the lock
            scatter(targets, pieces)

        def scatter_summed_then_die(
            targets: list[Any], pieces: tuple[Any, ...], fields: tuple[int, int, int, int]
        ) -> int:
            die_if_due(targets, pieces)  # a large one, copied (and summed) without it
            return scatter_summed(targets, pieces, fields)

        transfer.scatter = scatter_then_die  # type: ignore[assignment]
        transfer.scatter_summed = scatter_summed_then_die  # type: ignore[assignment]


class VanishingConnector(KVCacheConnector):
    """Deletes the third chunk of every prompt it is about to load, as an eviction between
    the scheduler's lookup and the load would: the load must report those blocks."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        settings = ConnectorSettings.from_extra_config(
            vllm_config.kv_transfer_config.kv_connector_extra_config
        )
        engine = engine_kv(vllm_config, kv_cache_config, settings.chunk_tokens)
        self._prefixes = PrefixCache(
            kvcache.open(settings.pool), model_id(vllm_config, None), engine.layout,
            chunk_tokens=settings.chunk_tokens,
        )  # fmt: skip

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        for load in self._get_connector_metadata().loads:
            del self._prefixes.pool[self._prefixes.chunk_keys(load.token_ids)[2]]
        super().start_load_kv(forward_context, **kwargs)
