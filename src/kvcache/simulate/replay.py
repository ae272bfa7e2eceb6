"""Replay a trace through the real engine: a scratch pool with the policy under test.

The pool is built under a hidden name in ``/dev/shm`` and never published, so
a simulation cannot touch (or even be listed beside) a live pool. Its file is
removed as soon as the pool is open: the replay needs only the mapping, and
the kernel frees the memory when the mapping goes, however the process ends
(SIGKILL included), so a killed simulation leaves nothing in ``/dev/shm``.
(A process killed in the instant between creating the file and removing it
leaves a hidden file whose build lease is free; the next ``create`` or
listing removes it, see ``kvcache.builds``.)

Each block is one entry filling one 1 KiB page (an 8-byte key and a 1016-byte
value), so the pool holds exactly ``capacity_blocks`` blocks whatever bytes
the model's KV really takes: what a policy keeps depends on the count of
equal blocks, not their size.

A request reads its blocks in order until the first miss (``get_into``: the
cached leading run is what a prefix cache reuses), then stores every block
from there on, as ``PrefixCache.store`` does, naming the block before it as
its parent for policies that track prefixes (a block id names its prefix).
"""

from __future__ import annotations

import time

import numpy as np

from ..config import PoolConfig
from ..lifecycle import create_from_config, discard
from ..policies import get_policy
from .outcome import Outcome, tally
from .traces import Trace

PAGE_BYTES = 1024
KEY_BYTES = 8
VALUE_BYTES = PAGE_BYTES - KEY_BYTES


def replay_pool(
    trace: Trace, policy: str, capacity_blocks: int, eviction_samples: int = 64
) -> Outcome:
    """Replay ``trace`` through a scratch pool of ``capacity_blocks`` blocks under ``policy``.

    ``priority`` pools get ``priority=-position`` (a block deeper in a prompt
    is shared by fewer prompts), prefix-tracking ones (``prefix``) each block's
    ``parent``; other policies get no per-put arguments.
    """
    config = PoolConfig.build(
        capacity_blocks * PAGE_BYTES,
        policy=policy,
        page_size=PAGE_BYTES,
        eviction_samples=eviction_samples,
    )
    moment = TraceClock(trace)
    pool = create_from_config(
        "simulate", config, clock=moment, rng=np.random.default_rng(0), hidden=True
    )
    discard(pool)  # its memory lives on in the mapping until close, or this process's end
    try:
        started = time.perf_counter()
        reused, evictions = _replay(
            pool,
            trace,
            moment,
            by_position=policy == "priority",
            with_parents=get_policy(policy).tracks_prefixes,
        )
        seconds = time.perf_counter() - started
        regret = pool.metrics().regret
    finally:
        pool.close()
    return tally(trace, policy, capacity_blocks, reused, evictions, seconds, regret)


class TraceClock:
    """The pool's wall clock during a replay: the arrival time of the request replayed, in
    seconds (so that eviction regret is measured in the trace's time, not the replay's)."""

    def __init__(self, trace: Trace) -> None:
        self._seconds = (trace.timestamps_ms / 1000.0).tolist()
        self.request = 0

    def __call__(self) -> float:
        return self._seconds[self.request] if self._seconds else 0.0


def _replay(
    pool: object, trace: Trace, moment: TraceClock, by_position: bool, with_parents: bool
) -> tuple[np.ndarray, int]:
    keys = trace.blocks.astype("<u8").tobytes()
    starts = trace.starts.tolist()
    value, buffer = bytes(VALUE_BYTES), bytearray(VALUE_BYTES)
    get_into, put = pool.get_into, pool.put  # type: ignore[attr-defined]
    reused = np.zeros(trace.num_requests, dtype=np.int64)
    for request in range(trace.num_requests):
        moment.request = request
        first, end = starts[request], starts[request + 1]
        read = first
        while read < end and get_into(keys[read * KEY_BYTES : (read + 1) * KEY_BYTES], buffer):
            read += 1
        reused[request] = read - first
        for position in range(read, end):
            key = keys[position * KEY_BYTES : (position + 1) * KEY_BYTES]
            if by_position:
                put(key, value, priority=first - position)
            elif with_parents and position > first:
                put(key, value, parent=keys[(position - 1) * KEY_BYTES : position * KEY_BYTES])
            else:
                put(key, value)
    return reused, pool.stats().evictions  # type: ignore[attr-defined]
