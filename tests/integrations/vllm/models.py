"""A small Llama for vLLM, built on disk in seconds: a config, seeded random weights and a
tokenizer trained here on generated words (nothing downloaded)."""

from __future__ import annotations

import json
import random
from pathlib import Path

VOCAB = 2048


def build_model(
    folder: Path, *, layers: int = 4, hidden: int = 256, sliding_window: int = 0
) -> Path:
    """Write a bfloat16 Llama (Mistral with a sliding window) to ``folder``; returns it."""
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
    common = dict(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
        initializer_range=0.1,  # wider than the default 0.02: logits far from tied
    )  # fmt: skip
    torch.manual_seed(0)
    if sliding_window:
        config = transformers.MistralConfig(sliding_window=sliding_window, **common)
        model = transformers.MistralForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    model.to(torch.bfloat16).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    return folder


def prompt(length: int, seed: int) -> list[int]:
    """``length`` random token ids (none of the special ones)."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]
