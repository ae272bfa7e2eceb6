"""Benchmark: time to first token with and without prefix reuse, on a CPU Llama.

Run from the repository root::

    .venv/bin/python benchmarks/bench_prefix.py            # 8 layers, 512-4096 tokens (~2 min)
    .venv/bin/python benchmarks/bench_prefix.py --quick    # 4 layers, 512 and 2048 (< 60 s)
    .venv/bin/python benchmarks/bench_prefix.py --dtype bfloat16 --chunk-tokens 256
    .venv/bin/python benchmarks/bench_prefix.py --tier disk   # adds the prefix on a disk pool
    .venv/bin/python benchmarks/bench_prefix.py --device cuda --shape 8b --dtype bfloat16

It prints a table and always exits 0 (it is not a test). The goals from the
issue, at 2048 tokens: time to first token (TTFT) with reuse at least 10x
lower than without, and kvcache's own time under 5% of what remains; each
request at 2048 tokens is marked PASS / MISS (not with ``--quick``: the goals
are for the full-size model, and the quick one is too small to judge by).

Method
------
* Model: ``LlamaForCausalLM`` from a ``LlamaConfig`` with seeded random
  weights (no download): 8 layers, hidden 1024, 16 attention heads of 64,
  4 KV heads (GQA), MLP 2816, vocabulary 32000, SDPA attention, float32 by
  default. ``--quick``: 4 layers, hidden 512, 8 heads, 2 KV heads, MLP 1408.
  ``--shape 8b``: Llama-3-8B's shape (32 layers, hidden 4096, 32 heads of
  128, 8 KV heads, MLP 14336), for a GPU (``--device cuda``): a GPU computes
  a small model's prefill faster than any host memory can hand it the KV.
  ``--shape 70b --layers 40``: Llama-3-70B's layers (hidden 8192, 64 heads,
  8 KV heads, MLP 28672), 40 of its 80 so that they fit one GPU: prefill
  time and KV bytes both grow with the layers, so their ratio is the model's.
* ``--device cuda``: the model and its KV on the GPU; ``kvhf.load`` retrieves
  into a pinned host buffer and moves it in one transfer, and "copy" adds
  that transfer to the floor. A last line compares that transfer from
  pinned and from ordinary (pageable) host memory. No goals are judged there.
* TTFT is one prefill forward (``logits_to_keep=1``) plus the argmax of the
  last logits: what ``generate`` does before its first token, without its
  bookkeeping. Without reuse: the whole prompt into an empty ``DynamicCache``.
  With reuse: ``kvhf.load`` (lookup, copy out of the pool, checksums, building
  the ``DynamicCache``; this is "kvcache" time), then the forward over the
  tokens not loaded. The first token must be the same both ways (checked).
* Two requests per prompt length N, after a first request of N tokens was run
  and its KV stored (``kvhf.save``, timed as "store"):
  - *same prompt*: the same N tokens again (a retry, another sample, a second
    process serving the same prompt): all but the last token are loaded;
  - *new question*: the first N-64 tokens again, then 64 new ones (a new
    question about the same document): the full chunks of the shared part
    are loaded, the rest is computed.
* kvcache share = kvcache time / TTFT with reuse (the time that remains).
  "copy" is the floor under kvcache's time: one ``numpy.copyto`` of the same
  bytes out of a /dev/shm mapping into a retrieve buffer, with the CPU caches
  flushed first (as the forward between requests flushes them), timed in the
  same run. Any design that hands the model private KV moves these bytes once.
  With ``--tier disk`` a third row per length, *same, disk*, loads the same
  prompt from a disk pool used directly (``tier="disk"``, in ``--folder``,
  default a new folder under /tmp; the KV of the first request was stored
  there too), with a cold page cache: before each run the disk pool is
  closed (a page a process maps is not dropped), the page cache dropped
  (``echo 3 > /proc/sys/vm/drop_caches``, needs root; otherwise the row says
  so) and the pool opened again, untimed. Through a chain (a pool in RAM
  spilling to the disk pool) a hit would also be promoted: that cost is
  measured by ``bench_tiers.py``. The no-reuse column is the recomputed case.
  Each figure is the median of ``--repeats`` runs after one untimed warm-up;
  the garbage collector is off while timing. The machine may be shared: look
  at the medians, and rerun if a row looks off.

The pool is named ``bench-prefix-<pid>`` (the disk pool ``bench-prefix-<pid>-disk``)
and destroyed in a ``finally`` block.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from kvcache.integrations import transformers as kvhf
except ImportError as exc:
    sys.exit(
        f"bench_prefix needs torch and transformers ({exc}): pip install 'kvcache[transformers]'"
    )

import numpy as np

import kvcache
from bench_pool import shm_array  # a touched /dev/shm mapping, as for the raw copy there
from bench_tiers import disk_folder, drop_page_cache

FULL = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
            intermediate_size=2816)  # fmt: skip
QUICK = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408)  # fmt: skip
VOCAB = 32000
NEW_TOKENS = 64
GOAL_AT, GOAL_SPEEDUP, GOAL_SHARE = 2048, 10.0, 0.05
FLUSH_BYTES = 256 << 20  # more than any CPU cache here


LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, intermediate_size=14336)  # fmt: skip
LLAMA_70B = dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                 num_key_value_heads=8, intermediate_size=28672)  # fmt: skip
SHAPES = {"quick": QUICK, "full": FULL, "8b": LLAMA_8B, "70b": LLAMA_70B}


def build_model(shape: dict[str, int], dtype: str, max_tokens: int, device: str = "cpu") -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=max_tokens, attn_implementation="sdpa", **shape
    )
    with torch.device(device):  # random weights made where they are used: fast on a GPU
        return LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()


def median_of(repeats: int, run: Callable[[], Any]) -> tuple[float, list[float], Any]:
    """Median seconds of ``repeats`` timed runs after an untimed one; the last result."""
    result = run()
    times = []
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            result = run()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return statistics.median(times), times, result


def cold_ttft(model: Any, ids: torch.Tensor) -> tuple[int, Any]:
    cache = DynamicCache()
    logits = model(ids, **{kvhf.CACHE_KEYWORD: cache}, use_cache=True, logits_to_keep=1).logits
    return int(logits[0, -1].argmax()), cache


def warm_ttft(model: Any, pc: kvcache.PrefixCache, ids: torch.Tensor) -> tuple[int, float, int]:
    """First token with reuse; also kvcache's seconds and the tokens loaded."""
    start = time.perf_counter()
    cache, n = kvhf.load(pc, ids, device=model.device)
    loaded = time.perf_counter() - start
    logits = model(
        ids[:, n:], **{kvhf.CACHE_KEYWORD: cache}, use_cache=True, logits_to_keep=1
    ).logits
    return int(logits[0, -1].argmax()), loaded, n


def copy_floor(
    pc: kvcache.PrefixCache, num_tokens: int, repeats: int, device: torch.device
) -> float:
    """Median seconds of one plain copy of ``num_tokens`` tokens' KV out of /dev/shm.

    The CPU caches are flushed before each copy, as the forward between two
    requests flushes them before each ``kvhf.load``. On a GPU, plus the pinned
    host -> device transfer of the same bytes.
    """
    flush = np.ones(FLUSH_BYTES, np.uint8)
    times = []
    nbytes = num_tokens * pc.layout.token_bytes
    with shm_array(nbytes) as source:
        target = pc.new_buffer(num_tokens).transpose(3, 0, 1, 2, 4).reshape(-1).view(np.uint8)
        for _ in range(repeats + 1):
            flush += 1
            start = time.perf_counter()
            np.copyto(target, source)
            times.append(time.perf_counter() - start)
    copy = statistics.median(times[1:])
    return copy + (transfer_seconds(nbytes, device, pinned=True) if device.type == "cuda" else 0)


def transfer_seconds(nbytes: int, device: torch.device, *, pinned: bool, repeats: int = 5) -> float:
    """Median seconds of one host -> ``device`` copy of ``nbytes`` (pinned or pageable host)."""
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        target.copy_(host)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


class ColdDisk:
    """A PrefixCache on a disk pool, reopened with a cold page cache before each load."""

    def __init__(self, name: str, size: str, folder: Path, model: Any, chunk_tokens: int) -> None:
        self.name, self.model, self.chunk_tokens = name, model, chunk_tokens
        self.pool = kvcache.create(name, size, tier="disk", path=folder)
        self.pc = self._prefix_cache()
        self.note: str | None = None

    def _prefix_cache(self) -> kvcache.PrefixCache:
        return kvhf.prefix_cache(
            self.pool, self.model, model_id="bench-llama", chunk_tokens=self.chunk_tokens
        )

    def cold(self) -> kvcache.PrefixCache:
        """The PrefixCache, its pool reopened after the page cache was dropped."""
        self.pool.close()  # first: pages a process maps are not dropped
        self.note = drop_page_cache()
        self.pool = kvcache.open(self.name)
        self.pc = self._prefix_cache()
        return self.pc

    def destroy(self) -> None:
        self.pool.close()
        kvcache.destroy(self.name)


def run(args: argparse.Namespace) -> None:
    shape = SHAPES[args.shape] | ({"num_hidden_layers": args.layers} if args.layers else {})
    lengths = (512, 2048) if args.quick else (512, 2048, 4096)
    model = build_model(shape, args.dtype, max(lengths) + NEW_TOKENS, args.device)
    name = f"bench-prefix-{os.getpid()}"
    pool = kvcache.create(name, args.pool_size)
    disk: ColdDisk | None = None
    folder, made_folder = (None, False)
    try:
        if args.tier == "disk":
            folder, made_folder = disk_folder(args.folder, name)
            disk = ColdDisk(f"{name}-disk", args.pool_size, folder, model, args.chunk_tokens)
        pc = kvhf.prefix_cache(pool, model, model_id="bench-llama", chunk_tokens=args.chunk_tokens)
        layout = pc.layout
        print(
            f"model: Llama {layout.num_layers} layers, hidden {shape['hidden_size']}, "
            f"{shape['num_attention_heads']} heads / {layout.num_kv_heads} KV heads of "
            f"{layout.head_dim}, {args.dtype}, on {device_name(model.device)}; "
            f"chunks of {args.chunk_tokens} tokens; KV {kvcache.format_size(layout.token_bytes)} "
            f"per token; median of {args.repeats}"
        )
        header = (
            f"{'prompt':>6} {'no reuse':>9} {'store':>8} | {'request':<12} {'loaded':>6} "
            f"{'TTFT':>8} {'speedup':>7} {'kvcache':>8} {'share':>6} {'copy':>7} {'share':>6}"
        )
        print(header)
        print("-" * len(header))
        generator = torch.Generator().manual_seed(1)
        judge = not args.quick and model.device.type == "cpu"
        with torch.inference_mode():
            for length in lengths:
                measure(model, pc, length, generator, args.repeats, judge=judge, disk=disk)
        if model.device.type == "cuda":
            nbytes = 2048 * layout.token_bytes
            pinned, pageable = (
                transfer_seconds(nbytes, model.device, pinned=pinned) for pinned in (True, False)
            )
            print(
                f"host -> GPU, the KV of 2048 tokens ({kvcache.format_size(nbytes)}): pinned "
                f"{pinned * 1e3:.2f} ms ({nbytes / pinned / 1e9:.1f} GB/s), pageable "
                f"{pageable * 1e3:.2f} ms ({nbytes / pageable / 1e9:.1f} GB/s)"
            )
        stats = pool.stats()
        print(
            f"pool '{name}': {stats.num_entries} chunks, {kvcache.format_size(stats.used_bytes)} "
            f"used, hits {stats.hits}, misses {stats.misses}"
        )
        if disk is not None:
            print(
                f"same, disk: disk pool '{disk.name}' in {folder}, "
                + (disk.note or "page cache dropped")
            )
    finally:
        pool.close()
        kvcache.destroy(name)
        if disk is not None:
            disk.destroy()
        if made_folder and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def measure(
    model: Any,
    pc: kvcache.PrefixCache,
    length: int,
    generator: torch.Generator,
    repeats: int,
    *,
    judge: bool,
    disk: ColdDisk | None = None,
) -> None:
    """One prompt length's rows; with ``judge``, PASS / MISS against the goals at GOAL_AT.

    With ``disk``, a last row loads the same prompt from that disk pool, page cache cold.
    """
    ids = torch.randint(0, VOCAB, (1, length), generator=generator).to(model.device)
    cold, _, (token, cache) = median_of(repeats, lambda: cold_ttft(model, ids))
    start = time.perf_counter()
    kvhf.save(pc, ids, cache)
    store = time.perf_counter() - start
    if disk is not None:
        kvhf.save(disk.pc, ids, cache)
    follow_up = torch.cat(
        [
            ids[:, : length - NEW_TOKENS],
            torch.randint(0, VOCAB, (1, NEW_TOKENS), generator=generator).to(model.device),
        ],
        dim=1,
    )
    rows = []
    for label, prompt in (("same prompt", ids), ("new question", follow_up)):
        expected = token if prompt is ids else cold_ttft(model, prompt)[0]
        runs: list[float] = []

        def once(prompt: torch.Tensor = prompt, runs: list[float] = runs) -> tuple[int, int]:
            first, loaded, n = warm_ttft(model, pc, prompt)
            runs.append(loaded)
            return first, n

        warm, _, (first, n) = median_of(repeats, once)
        if first != expected:
            sys.exit(f"reuse changed the first token at {length} tokens ({label}): a bug")
        kv_time = statistics.median(runs[1:])
        floor = copy_floor(pc, n, repeats, model.device)
        rows.append((label, n, warm, cold / warm, kv_time, floor))
    if disk is not None:
        rows.append(disk_row(model, disk, ids, token, cold, repeats, length))
    for i, (label, n, warm, speedup, kv_time, floor) in enumerate(rows):
        left = f"{length:>6} {cold * 1e3:>7.0f}ms {store * 1e3:>6.1f}ms" if i == 0 else " " * 26
        verdict = ""
        if judge and length == GOAL_AT:
            ok = speedup >= GOAL_SPEEDUP and kv_time / warm < GOAL_SHARE
            verdict = "  PASS" if ok else "  MISS"
        copy = f" {floor * 1e3:>5.2f}ms {floor / warm:>6.1%}{verdict}" if floor else ""
        print(
            f"{left} | {label:<12} {n:>6} {warm * 1e3:>6.1f}ms {speedup:>6.1f}x "
            f"{kv_time * 1e3:>6.2f}ms {kv_time / warm:>6.1%}{copy}"
        )


def disk_row(
    model: Any,
    disk: ColdDisk,
    ids: torch.Tensor,
    token: int,
    cold: float,
    repeats: int,
    length: int,
) -> tuple[str, int, float, float, float, float]:
    """The same prompt loaded from the disk pool, page cache dropped before each run."""
    ttfts, loads = [], []
    for i in range(repeats + 1):  # the first run is not counted, as in median_of
        pc = disk.cold()  # untimed
        gc.disable()
        try:
            start = time.perf_counter()
            first, loaded, n = warm_ttft(model, pc, ids)
            ttft = time.perf_counter() - start
        finally:
            gc.enable()
        if first != token:
            sys.exit(f"reuse from disk changed the first token at {length} tokens: a bug")
        if i:
            ttfts.append(ttft)
            loads.append(loaded)
    warm = statistics.median(ttfts)
    return ("same, disk", n, warm, cold / warm, statistics.median(loads), 0.0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small model, 512/2048 tokens (< 60 s)"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--chunk-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (--quick: 2)")
    parser.add_argument("--pool-size", default="2G")
    parser.add_argument(
        "--tier", default="cpu", choices=["cpu", "disk"], help="disk: add the prefix on a disk pool"
    )
    parser.add_argument("--folder", type=Path, default=None, help="disk pool folder (--tier disk)")
    parser.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:1")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default=None, help="model shape (default: full; quick)"
    )
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layers")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.shape is None:
        args.shape = "quick" if args.quick else "full"
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here")
    return args


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"the CPU, {torch.get_num_threads()} threads"


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
