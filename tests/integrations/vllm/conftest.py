"""Fixtures of the vLLM tests: the model, built once a session."""

from __future__ import annotations

import pytest

from kvcache.integrations.vllm.testmodel import build_model


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 4-layer bfloat16 Llama with random weights and a trained tokenizer, on disk."""
    return str(build_model(tmp_path_factory.mktemp("vllm-model") / "tiny-llama"))
