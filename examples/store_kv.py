"""Store twelve prompts' KV in a pool from another process, as an inference engine would.

The command-line session in the README runs it between ``cortex cache create``
and ``cortex cache list``::

    cortex cache create llama-cache --size 16G --policy lru
    python examples/store_kv.py llama-cache

Each value is one prompt's KV: a float16 array shaped (layers, keys and values,
KV heads, tokens, head size) = (8, 2, 4, 256, 64), 2 MiB, stored with priority
``i % 3``. Then a second request reuses five of the prompts (hits) and asks for
one that was never stored (a miss).
"""

from __future__ import annotations

import sys

import numpy as np

import kvcache

KV_SHAPE = (8, 2, 4, 256, 64)
NUM_PROMPTS = 12
REUSED = (3, 5, 7, 9, 11)


def main(name: str) -> None:
    rng = np.random.default_rng(0)
    with kvcache.open(name) as pool:
        for i in range(NUM_PROMPTS):
            kv = rng.standard_normal(KV_SHAPE, dtype=np.float32).astype(np.float16)
            pool.put(f"prompt-{i}", kv, priority=i % 3)
        for i in REUSED:
            kv = pool.get(f"prompt-{i}")
            assert kv is not None and kv.shape == KV_SHAPE
        assert pool.get(f"prompt-{NUM_PROMPTS}") is None


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama-cache")
