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
* Side by side: each engine runs ``--rounds`` rounds (5; ``--quick`` 2) of its
  cases in turn, on 2048-token prompts (``--quick``: 1024), and each case's
  figure is the median of its rounds (with the range), so a change of load
  during the run falls on every case of an engine alike; every ratio is
  taken within one engine. vLLM's prefix caching is on in every engine:

  - no connector: a new prompt (recomputed), then the same again (vLLM's own
    hit);
  - the connector on an empty pool: a new prompt (a miss that stores), then
    the same again (vLLM's own hit: the reference for the outputs);
  - the connector on that pool, a fresh engine (what another process or a
    restart sees): a new prompt (a miss), a prompt the engine before stored
    (loaded from the pool), then that again (vLLM's own hit, the ceiling);
  - the last two again over a disk pool (``ram:`` and ``disk:`` rows; the
    disk pool is left out with ``--quick``);
  - the engine without a connector again, last (``last:`` rows), which shows
    how much the order of the engines moved the figures.
* connector: the time spent inside the connector's methods during the timed
  request (lookup, plans, load, waiting for stores in flight), and its share
  of the TTFT; "store" is the background store of the request's chunks, which
  runs after its first token (waited for after the timing, not in it).
* Load: the 1-minute load average at each engine's start and after each
  request (the machine is shared; a hit's short forward suffers far more
  from other processes than a prefill does, see docs/vllm.md).
* Replay: a multi-turn conversation trace (``conversation_trace.py``'s
  shape, seed 1, 64 tokens per block, requests up to 3968 tokens; 60
  requests, ``--quick`` 6) sent one at a time to one engine: vLLM without
  prefix caching, vLLM with the connector as its only cache, and vLLM's own
  prefix cache; the sum of the TTFTs (the prefill time) of each.
* Outputs: the first token of every pool hit must equal that of vLLM's own
  hit of the prompt in the engine that stored it (the same numeric path;
  printed).

Pools are named ``bench-vllm-<pid>-...`` in a temporary ``KVCACHE_HOME`` and
destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conversation_trace import requests as trace_requests
from kvcache.integrations.vllm import KVCacheConnector
from kvcache.integrations.vllm.worker import WorkerSide

SPENT_S = [0.0]
"""Seconds spent in the connector's methods in this process (``TimedConnector``)."""
STORE_S = [0.0]
"""Seconds the connector's background store thread spent storing."""


def _timed(method: Callable[..., Any], into: list[float] = SPENT_S) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            into[0] += time.perf_counter() - started

    return timed


WorkerSide._store_all = _timed(WorkerSide._store_all, STORE_S)  # type: ignore[method-assign]


class TimedConnector(KVCacheConnector):
    """The connector, with the time spent in each of its methods added to ``SPENT_S``."""

    worker: WorkerSide | None = None
    """The worker side of this process's engine (in-process engines only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._worker is not None:
            TimedConnector.worker = self._worker

    on_new_request = _timed(KVCacheConnector.on_new_request)
    get_num_new_matched_tokens = _timed(KVCacheConnector.get_num_new_matched_tokens)
    update_state_after_alloc = _timed(KVCacheConnector.update_state_after_alloc)
    build_connector_meta = _timed(KVCacheConnector.build_connector_meta)
    start_load_kv = _timed(KVCacheConnector.start_load_kv)
    wait_for_save = _timed(KVCacheConnector.wait_for_save)
    handle_preemptions = _timed(KVCacheConnector.handle_preemptions)
    request_finished = _timed(KVCacheConnector.request_finished)


def settle_stores() -> float:
    """Wait for the background stores of this process's connector; the seconds they took."""
    if TimedConnector.worker is not None:
        TimedConnector.worker.settle()
    spent, STORE_S[0] = STORE_S[0], 0.0
    return spent


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
    """Run one engine: a warm-up, then the timed prompts; TTFT, cached tokens, connector time.

    ``prompts``: the prompts in order; ``labels``: the case of each (the same length).
    """
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
    load_before = os.getloadavg()[0]
    llm = LLM(**engine)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=tokens(512, seed=99))], params, use_tqdm=False)
    timed = sys.modules["bench_vllm"] if config.get("pool") else None
    spent = timed.SPENT_S if timed else [0.0]
    labels = config.get("labels") or [""] * len(config["prompts"])
    results = []
    for label, prompt in zip(labels, config["prompts"], strict=True):
        if timed:
            timed.settle_stores()
        spent[0] = 0.0
        started = time.perf_counter()
        output = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        ttft = time.perf_counter() - started
        results.append(
            {
                "label": label,
                "ttft_s": ttft,
                "connector_s": spent[0],
                "store_s": timed.settle_stores() if timed else 0.0,
                "cached": output.num_cached_tokens,
                "token": output.outputs[0].token_ids[0],
                "load": (load_before, os.getloadavg()[0]),
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
    parser.add_argument("--rounds", type=int, help="rounds of the cases (default 5, --quick 2)")
    parser.add_argument("--no-replay", action="store_true", help="the TTFT cases only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0

    import kvcache
    from kvcache.integrations.vllm.testmodel import build_model

    layers, hidden, length, replays = (4, 256, 1024, 6) if args.quick else (8, 1024, 2048, 60)
    rounds = args.rounds or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as scratch:
        workdir = Path(scratch)
        home = workdir / "home"
        home.mkdir()
        os.environ["KVCACHE_HOME"] = str(home)
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2")
        model = str(build_model(workdir / "model", layers=layers, hidden=hidden))
        ram, disk, trace = (f"bench-vllm-{os.getpid()}-{kind}" for kind in ("ram", "disk", "trace"))
        kvcache.create(ram, "2G", policy="prefix").close()
        kvcache.create(disk, "2G", policy="prefix", tier="disk").close()
        kvcache.create(trace, "4G", policy="prefix").close()
        seeds = iter(range(1, 1000))

        def new_prompts() -> list[list[int]]:
            return [tokens(length, seed=next(seeds)) for _ in range(rounds)]

        def run(cases: list[tuple[str, list[list[int]]]], **config: Any) -> list[dict[str, Any]]:
            """One engine, the cases in turn each round: [(label, a prompt per round)]."""
            plan = [(label, prompts[r]) for r in range(rounds) for label, prompts in cases]
            labels, prompts = zip(*plan, strict=True)
            return run_child(
                {"model": model, "labels": labels, "prompts": prompts, **config}, workdir, env
            )

        try:
            plain = new_prompts()
            results = run([(RECOMPUTED, plain), (OWN, plain)], prefix_caching=True)
            for pool in (ram, disk) if not args.quick else (ram,):  # --quick: CI's smoke run
                tier = "disk" if pool == disk else "ram"
                stored = new_prompts()
                results += run([(f"{tier}: {FILL}", stored), (f"{tier}: {FILL_OWN}", stored)],
                               pool=pool, prefix_caching=True)  # fmt: skip
                cases = [(MISS, new_prompts()), (ANOTHER, stored), (OWN_BESIDE, stored)]
                results += run([(f"{tier}: {label}", prompts) for label, prompts in cases],
                               pool=pool, prefix_caching=True)  # fmt: skip
            plain = new_prompts()  # the engine without a connector again, last: order effects
            results += run([(f"last: {RECOMPUTED}", plain), (f"last: {OWN}", plain)],
                           prefix_caching=True)  # fmt: skip
            report(results, layers, hidden, length, rounds)
            if args.no_replay:
                return 0
            prompts = trace_prompts(replays)
            replay = {
                "vLLM, no prefix caching": run_child(
                    {"model": model, "prompts": prompts}, workdir, env),
                "vLLM + connector (only cache)": run_child(
                    {"model": model, "prompts": prompts, "pool": trace}, workdir, env),
            }  # fmt: skip
            if not args.quick:
                replay["vLLM's own prefix cache"] = run_child(
                    {"model": model, "prompts": prompts, "prefix_caching": True}, workdir, env
                )
            report_replay(replay, prompts)
        finally:
            for name in (ram, disk, trace):
                kvcache.destroy(name, force=True)
    return 0


RECOMPUTED = "no connector: recomputed"
OWN = "no connector: vLLM's own hit"
FILL = "empty pool: a miss that stores"
FILL_OWN = "empty pool: then vLLM's own hit"
MISS = "another process: a miss"
ANOTHER = "another process: hit from the pool"
OWN_BESIDE = "another process: then vLLM's own hit"
ENGINE_CASES = ((RECOMPUTED, OWN), (FILL, FILL_OWN), (MISS, OWN_BESIDE, ANOTHER))
"""The cases of each engine: its recompute (or miss) first, then its own hit."""


def report(
    results: list[dict[str, Any]],
    layers: int,
    hidden: int,
    length: int,
    rounds: int,
) -> None:
    """Per case: the median TTFT of its rounds (and their range), against the recompute."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_case.setdefault(result["label"], []).append(result)

    def median(case: str, key: str = "ttft_s") -> float:
        return statistics.median(r[key] for r in by_case[case])

    def base_and_own(case: str) -> tuple[float, float]:
        """The median recompute (or miss) and own hit of the engine ``case`` ran in."""
        prefix = next((p for p in ("ram: ", "disk: ", "last: ") if case.startswith(p)), "")
        label = case[len(prefix) :]
        engine = next(cases for cases in ENGINE_CASES if label in cases)
        return median(prefix + engine[0]), median(prefix + engine[1])

    loads = [load for r in results for load in r["load"]]
    print(f"\nvLLM 0.32 CPU, {layers} layers x {hidden}, bf16, a {length}-token prompt; "
          f"median of {rounds} rounds; load average {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    print(f"{'case':45} {'cached':>6} {'TTFT (range)':>22} {'speed-up':>8} {'/ own':>6} "
          f"{'connector':>10} {'share':>6} {'store':>8}")  # fmt: skip
    for case, runs in by_case.items():
        ttft = median(case)
        base, own = base_and_own(case)
        low, high = min(r["ttft_s"] for r in runs), max(r["ttft_s"] for r in runs)
        connector, store = median(case, "connector_s"), median(case, "store_s")
        print(
            f"{case:45} {runs[0]['cached']:6d} {ttft * 1000:7.0f}ms ({low * 1000:5.0f}-"
            f"{high * 1000:5.0f}) {base / ttft:7.1f}x {ttft / own:5.2f}x "
            f"{connector * 1000:8.1f}ms {connector / ttft:6.1%} {store * 1000:6.1f}ms"
        )
    # round r of a pool hit loads the prompt that round r of the engine before computed and
    # then hit in its own cache: the same numeric path, so the same first token
    pairs = [(own, hit) for tier in ("ram", "disk") if f"{tier}: {ANOTHER}" in by_case
             for own, hit in zip(by_case[f"{tier}: {FILL_OWN}"], by_case[f"{tier}: {ANOTHER}"],
                                 strict=True)]  # fmt: skip
    same = sum(own["token"] == hit["token"] for own, hit in pairs)
    print(f"pool hits whose first token is that of vLLM's own hit in the engine that stored "
          f"the prompt: {same} of {len(pairs)}")  # fmt: skip
    print(
        "speed-up: against the recompute (or miss) of the same engine; / own: against "
        "vLLM's own hit in the same engine"
    )


def report_replay(replay: dict[str, list[dict[str, Any]]], prompts: list) -> None:
    total_tokens = sum(map(len, prompts))
    loads = [load for results in replay.values() for r in results for load in r["load"]]
    print(f"\nreplay: {len(prompts)} requests of a multi-turn trace, {total_tokens} prompt tokens; "
          f"load average {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    base = sum(r["ttft_s"] for r in replay["vLLM, no prefix caching"])
    for name, results in replay.items():
        total = sum(r["ttft_s"] for r in results)
        cached = sum(r["cached"] for r in results)
        connector = sum(r["connector_s"] for r in results)
        store = sum(r["store_s"] for r in results)
        print(
            f"{name:32} prefill {total:7.2f}s  saved {base - total:6.2f}s "
            f"({1 - total / base:5.1%})  cached tokens {cached:6d}  connector {connector:5.2f}s "
            f"(+ {store:5.2f}s of background stores)"
        )


if __name__ == "__main__":  # vLLM's engine may start processes that import this module
    sys.exit(main())
