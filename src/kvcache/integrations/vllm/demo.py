"""The vLLM demo: two vLLM processes, one pool; the second loads the first one's prefix.

This process creates a pool and writes a small Llama (8 layers x 1024,
random weights, nothing downloaded). A first vLLM process, with the
connector, answers a 2048-token prompt with nothing cached, storing its
chunks; then answers it again from vLLM's own prefix cache, which gives the
reference tokens. A second, fresh vLLM process answers the same prompt with
the prefix loaded from the pool, and checks that it generates exactly those
tokens. Each prints its time to first token (after a warm-up request: a fresh
vLLM process's first request pays seconds of one-time set-up); then the
pool's status is shown and the pool destroyed (``--keep`` leaves it).

Run: ``./scripts/demo.sh --vllm`` (or ``python -m kvcache.integrations.vllm.demo``
in a venv with vLLM 0.32; see docs/vllm.md).
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
from pathlib import Path
from typing import Any

import kvcache

from .testmodel import VOCAB, build_model

PROMPT_TOKENS = 2048
NEW_TOKENS = 16
CHUNK_TOKENS = 128  # the CPU backend's block: a hit covers all whole blocks before the last token


def main(argv: list[str] | None = None) -> None:
    """Create the pool and the model, run the two vLLM processes, show the pool."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="kvcache-vllm-demo")
    parser.add_argument("--keep", action="store_true", help="leave the pool for later use")
    parser.add_argument("--process", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process is not None:
        _serve(args.name, args.model, args.process)
        return
    if args.name in kvcache.list_pools():
        kvcache.destroy(args.name)
    kvcache.create(args.name, "1G", policy="prefix").close()
    print(f"created pool '{args.name}' (1 GiB in /dev/shm); two vLLM processes will use it")
    try:
        with tempfile.TemporaryDirectory(prefix="kvcache-vllm-demo-") as folder:
            model = build_model(Path(folder) / "model", layers=8, hidden=1024)
            for process in (1, 2):
                command = [sys.executable, "-m", "kvcache.integrations.vllm.demo", "--name",
                           args.name, "--model", str(model), "--process", str(process)]  # fmt: skip
                # vLLM's own logging off: its INFO lines go to stdout, and its warnings
                # then reach stderr, which is hidden (on a failure: run it again, see above)
                env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CONFIGURE_LOGGING": "0"}
                if subprocess.run(command, env=env, stderr=subprocess.DEVNULL).returncode:
                    sys.exit(f"vLLM process {process} failed: run it again with --keep and see "
                             "vLLM's log (its stderr is hidden here)")  # fmt: skip
        from ...cli import run

        run(["status", args.name])
    finally:
        if not args.keep and args.name in kvcache.list_pools():
            kvcache.destroy(args.name)


def _serve(name: str, model: str, process: int) -> None:
    """One vLLM process: time the prompt's first token, then generate and compare."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=model, dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.05,
        enforce_eager=True, enable_prefix_caching=process == 1,
        kv_transfer_config={
            "kv_connector": "KVCacheConnector",
            "kv_connector_module_path": "kvcache.integrations.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"pool": name, "chunk_tokens": CHUNK_TOKENS},
        },
    )  # fmt: skip
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=_tokens(512, 99))], greedy, use_tqdm=False)
    prompt = TokensPrompt(prompt_token_ids=_tokens(PROMPT_TOKENS, 1))
    started = time.perf_counter()
    first = llm.generate([prompt], greedy, use_tqdm=False)[0]
    ttft_s = time.perf_counter() - started
    more = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    tokens = list(llm.generate([prompt], more, use_tqdm=False)[0].outputs[0].token_ids)
    print(
        f"[process {process}, pid {os.getpid()}] {PROMPT_TOKENS}-token prompt, "
        f"{first.num_cached_tokens} tokens' KV from the pool: first token after {ttft_s:.3f} s",
        flush=True,
    )
    reference = Path(tempfile.gettempdir()) / f"{name}.reference.json"
    if process == 1:  # the second request was vLLM's own prefix-cache hit
        reference.write_text(json.dumps({"tokens": tokens, "ttft_s": ttft_s}))
        return
    expected: dict[str, Any] = json.loads(reference.read_text())
    reference.unlink()
    same = tokens == expected["tokens"]
    print(
        f"    {expected['ttft_s'] / ttft_s:.1f}x sooner than computing it; the {NEW_TOKENS} new "
        f"tokens {'are' if same else 'are NOT'} those of vLLM's own prefix cache",
        flush=True,
    )
    if not same:
        sys.exit(1)


def _tokens(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


if __name__ == "__main__":  # vLLM's engine core is a process that imports this module again
    main()
