"""What a vLLM engine's KV is named by in the pool, and which engines we refuse.

A chunk's key (``kvcache.prefix.keys``) chains its tokens over a namespace
of model id, KV layout, dtype, chunk size and salt. Here those come from
vLLM: the model's path or hub name and revision, the attention layers' KV
spec, and per request its ``cache_salt`` and LoRA adapter, so tenants and
adapters never read each other's KV. vLLM's block size and block hashes are
not part of it: engines with other block sizes (or transformers, which stores
the same keys) share the chunks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ...errors import InvalidArgument
from ...pool import Pool
from ...prefix import KVLayout, PrefixCache
from ...prefix.arrays import torch_dtype_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineKV:
    """The KV of one engine as the connector copies it.

    Attributes:
        layer_names: vLLM's attention layers, in the order the pool stores them.
        layout: layers, KV heads, head size and dtype.
        block_size: tokens per vLLM block (the scheduler's).
    """

    layer_names: tuple[str, ...]
    layout: KVLayout
    block_size: int


def engine_kv(vllm_config: Any, kv_cache_config: Any, chunk_tokens: int) -> EngineKV:
    """Read the engine's KV layout, refusing what the connector cannot store exactly.

    Refused: layers that are not all plain full attention (sliding window,
    chunked local, Mamba/linear state, MLA, hybrids: they do not keep every
    token's K and V, or keep them in another form), quantized KV, tensor or
    pipeline parallelism (each rank would hold part of the heads), and a
    chunk size that is not a whole number of vLLM blocks.

    Raises:
        InvalidArgument: one line naming what is refused and what to do.
    """
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    kinds = sorted({type(group.kv_cache_spec).__name__ for group in groups})
    if len(groups) != 1 or kinds != ["FullAttentionSpec"]:
        raise InvalidArgument(
            f"the kvcache connector stores only models whose attention layers are all plain "
            f"full attention; this one has KV cache groups of kind {', '.join(kinds)} "
            "(sliding window, hybrid or Mamba layers): run it without --kv-transfer-config"
        )
    spec = groups[0].kv_cache_spec
    assert isinstance(spec, FullAttentionSpec)
    if spec.sliding_window is not None or spec.attention_chunk_size is not None:
        raise InvalidArgument(
            "the kvcache connector does not store sliding-window or chunked-local attention: "
            "run this model without --kv-transfer-config"
        )
    dtype = torch_dtype_name(spec.dtype)
    if dtype is None or spec.head_size_v not in (None, spec.head_size):
        raise InvalidArgument(
            f"the kvcache connector stores float32/float16/bfloat16 KV with equal key and value "
            f"sizes, not {spec.dtype} (--kv-cache-dtype auto)"
        )
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        raise InvalidArgument(
            "the kvcache connector does not support tensor or pipeline parallelism yet: "
            "run with --tensor-parallel-size 1 --pipeline-parallel-size 1"
        )
    block_size = spec.block_size
    if chunk_tokens % block_size:
        raise InvalidArgument(
            f"chunk_tokens ({chunk_tokens}) must be a multiple of vLLM's block size "
            f"({block_size}): set it in kv_connector_extra_config"
        )
    layout = KVLayout(
        num_layers=len(groups[0].layer_names),
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_size,
        dtype=dtype,
    )
    return EngineKV(tuple(groups[0].layer_names), layout, block_size)


def model_id(vllm_config: Any, configured: str | None) -> str:
    """The name chunks are kept under: ``configured``, or the model and its revision."""
    if configured:
        return configured
    model = vllm_config.model_config
    revision = getattr(model, "revision", None)
    return f"{model.model}@{revision}" if revision else str(model.model)


def request_salt(request: Any) -> str | None:
    """The namespace salt of a vLLM request: its ``cache_salt`` and LoRA adapter, or None."""
    parts = []
    if request.cache_salt:
        parts.append(f"cache_salt={request.cache_salt}")
    lora = request.lora_request
    if lora is not None:
        parts.append(f"lora={lora.lora_name}:{getattr(lora, 'lora_path', '')}")
    return "\n".join(parts) or None


def why_not_named(request: Any) -> str | None:
    """Why the connector cannot name this request's KV by its tokens, or None if it can.

    Multimodal inputs and prompt embeddings put KV behind placeholder tokens
    that do not say what was embedded, so equal token ids would not mean equal KV.
    """
    if request.mm_features:
        return "multimodal inputs"
    if request.prompt_embeds is not None or request.prompt_token_ids is None:
        return "prompt embeddings"
    return None


class Caches:
    """One :class:`PrefixCache` per salt over one pool, made when first asked for."""

    def __init__(self, pool: Pool, model: str, layout: KVLayout, chunk_tokens: int) -> None:
        self.pool = pool
        self.model = model
        self.layout = layout
        self.chunk_tokens = chunk_tokens
        self._by_salt: dict[str | None, PrefixCache] = {}

    def get(self, salt: str | None) -> PrefixCache:
        """The prefix cache of ``salt``."""
        cache = self._by_salt.get(salt)
        if cache is None:
            cache = PrefixCache(
                self.pool, self.model, self.layout, chunk_tokens=self.chunk_tokens, salt=salt
            )
            self._by_salt[salt] = cache
        return cache
