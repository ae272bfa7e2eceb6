"""Run a real vLLM engine over token prompts and print what it generated, as JSON.

Run as a script, in its own process (vLLM's engine is one per process)::

    python engine_run.py CONFIG.json

CONFIG: ``model``; ``rounds``: lists of prompts (token id lists), each round
generated after the one before, in this one engine; ``connector``: the
``kv_connector_extra_config`` (absent: no connector); ``module`` and ``class``:
the connector's (default ``kvcache.integrations.vllm.KVCacheConnector``); ``engine``: more
``LLM(...)`` arguments; ``max_tokens``. Prints one JSON object: per round,
per prompt, the greedy tokens, their top-5 logprobs and vLLM's
``num_cached_tokens``, and with a connector the tokens its pool served in
that prompt's round (``pool_hit``: the pool's token counter).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def run(config: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine: dict[str, Any] = {
        "model": config["model"],
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "seed": 0,
        "enable_prefix_caching": False,
        # on the CPU backend this is the share of the machine's memory vLLM reserves, and it
        # refuses to start when less is free (the KV cache itself: VLLM_CPU_KVCACHE_SPACE)
        "gpu_memory_utilization": 0.05,
        **config.get("engine", {}),
    }
    if "connector" in config:
        engine["kv_transfer_config"] = {
            "kv_connector": config.get("class", "KVCacheConnector"),
            "kv_connector_module_path": config.get("module", "kvcache.integrations.vllm"),
            "kv_role": "kv_both",
            "kv_connector_extra_config": config["connector"],
        }
    llm = LLM(**engine)
    params = SamplingParams(temperature=0.0, max_tokens=config.get("max_tokens", 8), logprobs=5)
    rounds = []
    for prompts in config["rounds"]:
        before = _pool_hits(config)
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
        served = _pool_hits(config) - before
        rounds.append([{**_described(output), "pool_hit": served} for output in outputs])
    return {"rounds": rounds}


def _pool_hits(config: dict[str, Any]) -> int:
    """The tokens the connector's pool has served the model so far (0 without one)."""
    if "connector" not in config:
        return 0
    import kvcache

    connector = config["connector"]
    with kvcache.open(connector["pool"]) as pool:
        counts = pool.metrics().tokens.get(connector.get("model_id") or config["model"])
    return 0 if counts is None else counts.hit


def _described(output: Any) -> dict[str, Any]:
    completion = output.outputs[0]
    return {
        "tokens": list(completion.token_ids),
        "logprobs": [
            sorted((token, entry.logprob) for token, entry in step.items())
            for step in completion.logprobs
        ],
        "num_cached_tokens": output.num_cached_tokens,
    }


if __name__ == "__main__":  # vLLM's engine may start processes that import this module
    with open(sys.argv[1]) as file:
        result = run(json.load(file))
    print("RESULT " + json.dumps(result), flush=True)
