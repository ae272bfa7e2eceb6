"""What a documentation block takes as given: a model and its inputs, built here instead of
downloaded, so the engines' examples run as a reader would write them.

A block preceded by ``<!-- run with: NAME -->`` runs after ``GIVEN[NAME].code``, in the
same interpreter as the page's other Python blocks (``tests/test_docs.py``). A page whose
given needs a package that is not installed is skipped, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Given:
    """Code run before a block, and the packages it needs."""

    needs: tuple[str, ...]
    code: str


TINY_LLAMA = """
import torch
import transformers

import kvcache

# a 2-layer Llama with random weights (the model you would load), and the KV of 512
# tokens in Llama-3-8B's layout (32 layers, 8 KV heads of 128, bfloat16) for PrefixCache
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(
    transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )
).eval()
input_ids = torch.randint(0, 512, (1, 600), generator=torch.Generator().manual_seed(1))
token_ids = input_ids[0, :512].tolist()
kv = torch.rand(32, 2, 8, len(token_ids), 128, dtype=torch.bfloat16)
if "llama-cache" not in kvcache.list_pools():
    kvcache.create("llama-cache", "512M", policy="prefix").close()
"""

TINY_GGUF = """
from pathlib import Path

import llama_cpp

import kvcache
from kvcache.integrations.gguf_model import ModelShape, write_model

# a 2-layer Llama with random weights and a small vocabulary, written as GGUF
write_model(Path("model.gguf"), ModelShape(context_tokens=4096))
llm = llama_cpp.Llama(model_path="model.gguf", n_ctx=4096, verbose=False)
if "llama-cache" not in kvcache.list_pools():
    kvcache.create("llama-cache", "256M").close()
"""

TINY_VLLM = """
import os
from pathlib import Path

from kvcache.integrations.vllm.testmodel import build_model

# a 4-layer Llama with random weights and a tokenizer trained here, as ./my-model; vLLM's
# CPU backend given 1 GiB for KV, its engine run in this process
build_model(Path("my-model"))
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
"""

GIVEN = {
    # model, input_ids, token_ids, kv and the pool llama-cache
    "tiny_llama": Given(needs=("torch", "transformers"), code=TINY_LLAMA),
    # model.gguf, llm and the pool llama-cache
    "tiny_gguf": Given(needs=("llama_cpp", "gguf"), code=TINY_GGUF),
    # ./my-model, for vLLM (whose own venv runs it: tests/integrations/vllm/test_docs_blocks.py)
    "tiny_vllm": Given(needs=("vllm",), code=TINY_VLLM),
}
"""Each given by the name a page gives it."""
