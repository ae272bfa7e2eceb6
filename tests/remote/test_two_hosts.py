"""The README's second demo mode, run for real: two "hosts" (separate processes, each with
its own pool and KVCACHE_HOME) share one private redis-server; host B finds host A's
prefix in Redis, promotes it, and generates exactly the tokens it would without reuse."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import kvcache


def test_host_b_reuses_host_a_prefix_through_redis_with_identical_tokens():
    name = f"demo-{uuid.uuid4().hex[:8]}"
    result = subprocess.run(
        [sys.executable, "-m", "kvcache.demo", "--two-hosts", "--name", name],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    host_a, host_b = out.split("host A:\n")[1].split("host B:\n")
    assert "0 tokens' KV from the pool" in host_a
    assert "1984 tokens' KV from Redis (31 chunks)" in host_b
    assert "the 16 new tokens are the same" in host_b
    assert re.search(r"spills / promotions\s+0 / 31\b", out)  # promoted into host B's pool
    assert re.search(r"writes\s+every put \(write-through\)", out)
    assert not {f"{name}-a", f"{name}-b"} & set(kvcache.list_pools())
