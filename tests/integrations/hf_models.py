"""Tiny transformers models with random weights (no downloads) and prompts, for the tests."""

from __future__ import annotations

import torch
import transformers

from kvcache.integrations import transformers as kvhf

CHUNK = 8
VOCAB = 512


def tiny_llama(
    *, layers: int = 2, kv_heads: int = 2, dtype: torch.dtype = torch.float32, attn: str = "sdpa"
) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=kv_heads, intermediate_size=128, max_position_embeddings=256,
        attn_implementation=attn,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def prefill(model, ids: torch.Tensor) -> transformers.DynamicCache:
    """The cache of a forward over ids (outputs.cache from 5.24, .past_key_values before)."""
    return getattr(model(ids, use_cache=True), kvhf.CACHE_KEYWORD)
