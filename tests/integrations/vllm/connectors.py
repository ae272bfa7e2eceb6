"""Connectors that go wrong on purpose, loaded by vLLM as ``kv_connector_module_path``
``connectors`` (this folder is on the engines' PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from typing import Any

from kvcache import transfer
from kvcache.integrations.vllm import KVCacheConnector
from kvcache.integrations.vllm.paged import PagedLayout


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
        scatter = transfer.scatter
        puts = {"count": 0}
        crash_at = int(os.environ.get("CRASH_AT_PUT", "3"))

        def scatter_then_die(targets: list[Any], pieces: tuple[Any, ...]) -> None:
            puts["count"] += 1
            if puts["count"] == crash_at:
                torn = bytes(pieces[-1])[: len(pieces[-1]) // 2]
                scatter(targets, (*pieces[:-1], torn))
                os.kill(os.getpid(), signal.SIGKILL)
            scatter(targets, pieces)

        transfer.scatter = scatter_then_die  # type: ignore[assignment]
