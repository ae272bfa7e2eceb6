"""Child processes for the prefix-sharing tests: ``python prefix_workers.py COMMAND 'JSON'``.

Each command opens the pool by name, does one thing and prints its result as
one JSON line. KV and models are rebuilt from seeds, so parent and children
agree on them without passing any tensors.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from workers import Children

import kvcache
from kvcache import KVLayout, PrefixCache

PREFIX_WORKERS = Path(__file__).resolve()
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


HAMMER_CHUNK = 128
"""128 tokens of LAYOUT are 128 KiB: over Pool's inline-copy limit, so chunks are
copied outside the lock and checked against concurrent eviction."""


def hammer_prompt(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt ``seed`` of the hammer: its tokens and their KV (4 or 5 chunks and a bit)."""
    num_tokens = HAMMER_CHUNK * (4 + seed % 2) + 7
    return seeded_tokens(seed, num_tokens), seeded_kv(seed, num_tokens)


def prefix_hammer(params: dict[str, Any]) -> dict[str, Any]:
    """Store and retrieve a few prompts at random for ``seconds``; check every hit's KV."""
    rng = np.random.default_rng(params["seed"])
    prompts = [hammer_prompt(seed) for seed in range(params["prompts"])]
    counts = {"stores": 0, "retrieves": 0, "hits": 0, "partial": 0}
    failures: list[str] = []
    with kvcache.open(params["pool"]) as pool:
        pc = PrefixCache(pool, "model", LAYOUT, chunk_tokens=HAMMER_CHUNK)
        out = pc.new_buffer(HAMMER_CHUNK * 6)
        end = time.monotonic() + params["seconds"]
        while time.monotonic() < end:
            seed = int(rng.integers(len(prompts)))
            tokens, kv = prompts[seed]
            if rng.random() < 0.4:
                pc.store(tokens, kv)
                counts["stores"] += 1
                continue
            got, n = pc.retrieve(tokens, out=out if rng.random() < 0.5 else None)
            counts["retrieves"] += 1
            counts["hits"] += n > 0
            counts["partial"] += 0 < n < len(tokens) - len(tokens) % HAMMER_CHUNK
            if not np.array_equal(got, kv[:, :, :, :n]):
                failures.append(f"prompt {seed}: {n} tokens retrieved, not the ones stored")
    return {**counts, "failures": failures[:5]}


COMMANDS = {
    "store-kv": store_kv,
    "retrieve-kv": retrieve_kv,
    "generate": generate,
    "prefix-hammer": prefix_hammer,
}


def run_child(command: str, timeout: float = 120, **params: Any) -> dict[str, Any]:
    """Run ``command`` in a new Python process; its JSON result."""
    with Children(PREFIX_WORKERS) as children:
        return children.result(children.start(command, **params), timeout=timeout)


if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))))
