"""A small Llama that vLLM loads, written in seconds: a config, seeded random weights and a
word-level tokenizer trained here (nothing downloaded). For the tests, the benchmark and
the demo; needs transformers and tokenizers (vLLM's own dependencies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOCAB = 2048
"""Token ids 0-2 are <unk>, <s> and </s>; words ``w0``... take the rest."""


def build_model(
    folder: Path, *, layers: int = 4, hidden: int = 256, sliding_window: int = 0
) -> Path:
    """Write a bfloat16 Llama (a Mistral, with ``sliding_window``) to ``folder``; return it.

    Args:
        folder: created if missing.
        layers, hidden: its depth and width (4 x 256: tests; 8 x 1024: the benchmark).
        sliding_window: give the attention a window (models the connector refuses).
    """
    import tokenizers
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    words = [f"w{index}" for index in range(VOCAB)]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"]
    )
    tokenizer.train_from_iterator([" ".join(words)] * 2, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)
    heads = hidden // 64  # head size 64; a KV head per 4 heads (at least 2), as in Llama 3
    common: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=max(2, heads // 4),
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
        initializer_range=0.1,  # wider than the default 0.02: logits far from tied
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any
    if sliding_window:
        config = transformers.MistralConfig(sliding_window=sliding_window, **common)
        model = transformers.MistralForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    model.to(torch.bfloat16).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return folder
