"""Benchmark: vLLM time to first token with the kvcache connector, and without.

Run from the repository root, with the vLLM venv (``scripts/setup.sh --vllm``)::

    .venv-vllm/bin/python benchmarks/bench_vllm.py            # 8 layers x 1024 (~15 min, 2 cores)
    .venv-vllm/bin/python benchmarks/bench_vllm.py --quick    # 4 x 256, fewer cases: CI smoke

It prints tables and always exits 0 (it is not a test).

Method
------
* Model: ``kvcache.integrations.vllm.testmodel``, bfloat16 with random weights:
  8 layers, hidden 1024 (``--quick``: 4 x 256). vLLM 0.32 on the CPU backend,
  one engine per process, in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
  eager, block size 128; the connector with 128-token chunks (so a hit covers
  the whole blocks before the last token, as vLLM's own prefix cache does).
* TTFT: ``llm.generate(prompt, max_tokens=1)``'s wall time, after one untimed
  warm-up request on other tokens in the same process (a fresh vLLM process's
  first request pays 1.5-2 s of one-time set-up), so it holds scheduling, the
  connector's lookup and load, the prefill of the rest and one sampling step.
* Cases, each in a process of its own, on a 2048-token prompt (``--quick``: 1024):
  recomputed (no connector); vLLM's own prefix cache hit (the same prompt
  again in that process: the ceiling); with the connector on an empty pool
  (a miss that stores); loaded from the pool in another process; the same
  after an engine restart; and loaded from a disk pool in another process.
* connector: the time spent inside the connector's methods during the timed
  request (lookup, plans, load, store), and its share of the TTFT.
* Replay: a multi-turn conversation trace (``conversation_trace.py``'s
  shape, seed 1, 64 tokens per block, requests up to 3968 tokens; 60
  requests, ``--quick`` 6) sent one at a time to one engine: vLLM without
  prefix caching, vLLM with the connector as its only cache, and vLLM's own
  prefix cache; the sum of the TTFTs (the prefill time) of each.
* Outputs: the first token of every hit must equal the recomputed one (printed).

Pools are named ``bench-vllm-<pid>-...`` in a temporary ``KVCACHE_HOME`` and
destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conversation_trace import requests as trace_requests
from kvcache.integrations.vllm import KVCacheConnector

SPENT_S = [0.0]
"""Seconds spent in the connector's methods in this process (``TimedConnector``)."""


def _timed(method: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            SPENT_S[0] += time.perf_counter() - started

    return timed


class TimedConnector(KVCacheConnector):
    """The connector, with the time spent in each of its methods added to ``SPENT_S``."""

    on_new_request = _timed(KVCacheConnector.on_new_request)
    get_num_new_matched_tokens = _timed(KVCacheConnector.get_num_new_matched_tokens)
    update_state_after_alloc = _timed(KVCacheConnector.update_state_after_alloc)
    build_connector_meta = _timed(KVCacheConnector.build_connector_meta)
    start_load_kv = _timed(KVCacheConnector.start_load_kv)
    wait_for_save = _timed(KVCacheConnector.wait_for_save)
    request_finished = _timed(KVCacheConnector.request_finished)


def tokens(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2048) for _ in range(length)]


def trace_prompts(num_requests: int, block_tokens: int = 64, max_tokens: int = 3968) -> list:
    """Prompts of the conversation trace: each block id stands for its own seeded tokens."""
    prompts = []
    for request in trace_requests(10 * num_requests, seed=1):
        hash_ids = request["hash_ids"]
        assert isinstance(hash_ids, list)
        if len(hash_ids) * block_tokens > max_tokens:
            continue
        prompts.append([t for h in hash_ids for t in tokens(block_tokens, 1_000_000 + h)])
        if len(prompts) == num_requests:
            break
    return prompts


# ------------------------------------------------------------------ one engine process


def child(config: dict[str, Any]) -> dict[str, Any]:
    """Run one engine: a warm-up, then the timed prompts; TTFT, cached tokens, connector time."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    engine: dict[str, Any] = {
        "model": config["model"], "dtype": "bfloat16", "max_model_len": 4096,
        "enforce_eager": True, "gpu_memory_utilization": 0.05, "seed": 0,
        "enable_prefix_caching": config.get("prefix_caching", False),
    }  # fmt: skip
    if config.get("pool"):
        engine["kv_transfer_config"] = {
            "kv_connector": "TimedConnector",
            "kv_connector_module_path": "bench_vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"pool": config["pool"], "chunk_tokens": 128},
        }
    llm = LLM(**engine)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=tokens(512, seed=99))], params, use_tqdm=False)
    spent = sys.modules["bench_vllm"].SPENT_S if config.get("pool") else [0.0]
    results = []
    for prompt in config["prompts"]:
        spent[0] = 0.0
        started = time.perf_counter()
        output = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        results.append(
            {
                "ttft_s": time.perf_counter() - started,
                "connector_s": spent[0],
                "cached": output.num_cached_tokens,
                "token": output.outputs[0].token_ids[0],
            }
        )
    return {"results": results}


def run_child(config: dict[str, Any], workdir: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    path = workdir / f"child-{len(list(workdir.glob('child-*.json')))}.json"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path)],
        capture_output=True, text=True, env=env, cwd=Path(__file__).parent,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"an engine failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])["results"]


# ------------------------------------------------------------------------- the parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small model, short prompt")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0

    import kvcache
    from kvcache.integrations.vllm.testmodel import build_model

    layers, hidden, length, replays = (4, 256, 1024, 6) if args.quick else (8, 1024, 2048, 60)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as scratch:
        workdir = Path(scratch)
        home = workdir / "home"
        home.mkdir()
        os.environ["KVCACHE_HOME"] = str(home)
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2")
        model = str(build_model(workdir / "model", layers=layers, hidden=hidden))
        prompt = tokens(length, seed=1)
        ram, disk, trace = (f"bench-vllm-{os.getpid()}-{kind}" for kind in ("ram", "disk", "trace"))
        kvcache.create(ram, "2G", policy="prefix").close()
        kvcache.create(disk, "2G", policy="prefix", tier="disk").close()
        kvcache.create(trace, "4G", policy="prefix").close()

        def run(**config: Any) -> list[dict[str, Any]]:
            return run_child({"model": model, **config}, workdir, env)

        try:
            own = run(prompts=[prompt, prompt], prefix_caching=True)
            cases = {
                "recomputed (no connector)": own[0],
                "vLLM's own prefix cache hit": own[1],
                "connector, empty pool (stores)": run(prompts=[prompt], pool=ram)[0],
                "connector, pool filled by another process": run(prompts=[prompt], pool=ram)[0],
            }
            if not args.quick:  # --quick: CI's smoke run, 5 engines instead of 10
                cases["connector, after an engine restart"] = run(prompts=[prompt], pool=ram)[0]
                run(prompts=[prompt], pool=disk)
                cases["connector, disk pool, another process"] = run(prompts=[prompt], pool=disk)[0]
            report(cases, layers, hidden, length)
            prompts = trace_prompts(replays)
            replay = {
                "vLLM, no prefix caching": run(prompts=prompts),
                "vLLM + connector (only cache)": run(prompts=prompts, pool=trace),
            }
            if not args.quick:
                replay["vLLM's own prefix cache"] = run(prompts=prompts, prefix_caching=True)
            report_replay(replay, prompts)
        finally:
            for name in (ram, disk, trace):
                kvcache.destroy(name, force=True)
    return 0


def report(cases: dict[str, dict[str, Any]], layers: int, hidden: int, length: int) -> None:
    base = cases["recomputed (no connector)"]
    own = cases["vLLM's own prefix cache hit"]["ttft_s"]
    print(f"\nvLLM 0.32 CPU, {layers} layers x {hidden}, bf16, a {length}-token prompt")
    print(f"{'case':45} {'cached':>6} {'TTFT':>9} {'speed-up':>8} {'/ own':>6} "
          f"{'connector':>10} {'share':>6}  same 1st token")  # fmt: skip
    for name, case in cases.items():
        ttft = case["ttft_s"]
        share = case["connector_s"] / ttft
        print(
            f"{name:45} {case['cached']:6d} {ttft * 1000:7.0f}ms {base['ttft_s'] / ttft:7.1f}x "
            f"{ttft / own:5.2f}x {case['connector_s'] * 1000:8.1f}ms {share:6.1%}  "
            f"{case['token'] == base['token']}"
        )


def report_replay(replay: dict[str, list[dict[str, Any]]], prompts: list) -> None:
    total_tokens = sum(map(len, prompts))
    print(f"\nreplay: {len(prompts)} requests of a multi-turn trace, {total_tokens} prompt tokens")
    base = sum(r["ttft_s"] for r in replay["vLLM, no prefix caching"])
    for name, results in replay.items():
        total = sum(r["ttft_s"] for r in results)
        cached = sum(r["cached"] for r in results)
        connector = sum(r["connector_s"] for r in results)
        print(
            f"{name:32} prefill {total:7.2f}s  saved {base - total:6.2f}s "
            f"({1 - total / base:5.1%})  cached tokens {cached:6d}  connector {connector:5.2f}s"
        )


if __name__ == "__main__":  # vLLM's engine may start processes that import this module
    sys.exit(main())
