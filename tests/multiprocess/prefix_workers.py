"""Child processes for the prefix-sharing tests: ``python prefix_workers.py COMMAND 'JSON'``.

Each command opens the pool by name, does one thing and prints its result as
one JSON line. KV and models are rebuilt from seeds, so parent and children
agree on them without passing any tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import kvcache
from kvcache import KVLayout, PrefixCache

HERE = Path(__file__).resolve()
LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=32, dtype="float16")
CHUNK = 16


def seeded_kv(seed: int, num_tokens: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (LAYOUT.num_layers, 2, LAYOUT.num_kv_heads, num_tokens, LAYOUT.head_dim)
    return rng.standard_normal(shape).astype(np.float16)


def seeded_tokens(seed: int, num_tokens: int) -> np.ndarray:
    return np.random.default_rng(seed + 1000).integers(0, 50_000, num_tokens)


def store_kv(params: dict[str, Any]) -> dict[str, Any]:
    with kvcache.open(params["pool"]) as pool:
        pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
        tokens = seeded_tokens(params["seed"], params["tokens"])
        return {"stored": pc.store(tokens, seeded_kv(params["seed"], params["tokens"]))}


def retrieve_kv(params: dict[str, Any]) -> dict[str, Any]:
    with kvcache.open(params["pool"]) as pool:
        pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=CHUNK)
        kv, n = pc.retrieve(seeded_tokens(params["seed"], params["tokens"]))
        expected = seeded_kv(params["seed"], params["tokens"])[:, :, :, :n]
        return {"n": n, "same": bool(np.array_equal(kv, expected))}


def tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def llama_prompt(seed: int, num_tokens: int) -> Any:
    import torch

    return torch.randint(0, 512, (1, num_tokens), generator=torch.Generator().manual_seed(seed))


def generate(params: dict[str, Any]) -> dict[str, Any]:
    import torch

    from kvcache.integrations import transformers as kvhf

    model = tiny_llama()
    ids = llama_prompt(params["seed"], params["tokens"])
    with kvcache.open(params["pool"]) as pool, torch.inference_mode():
        pc = kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=8)
        reused = pc.lookup(ids)
        out = kvhf.generate(model, pc, ids, max_new_tokens=params["new_tokens"], do_sample=False)
    return {"reused": reused, "tokens": out[0].tolist()}


COMMANDS = {"store-kv": store_kv, "retrieve-kv": retrieve_kv, "generate": generate}


def run_child(command: str, timeout: float = 120, **params: Any) -> dict[str, Any]:
    """Run ``command`` in a new Python process; its JSON result."""
    done = subprocess.run(
        [sys.executable, str(HERE), command, json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))))
