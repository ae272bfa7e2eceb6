"""Prompts for the vLLM tests (the model: ``kvcache.integrations.vllm.testmodel``)."""

from __future__ import annotations

import random

from kvcache.integrations.vllm.testmodel import VOCAB


def prompt(length: int, seed: int) -> list[int]:
    """``length`` random token ids (none of the special ones)."""
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]
