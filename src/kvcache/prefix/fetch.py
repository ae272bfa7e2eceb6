"""Copy a run of chunks out of the pool into one buffer, verifying each one.

Chunk i goes to bytes [i*C, (i+1)*C) of the buffer (C: bytes per chunk)
with one ``Pool.get_into``; its 64-byte trailer lands just after, where
chunk i+1 will go, and is read before that copy overwrites it::

    buffer  | chunk 0 payload | chunk 1 payload | ... | chunk n-1 payload | slack |
                              ^ chunk 0's trailer, then chunk 1's payload

The hit ends at the first chunk that is missing, damaged or of another
namespace; a damaged one is deleted so that the next store replaces it.

Checksums are computed inline, right after each copy. Handing them to a
helper thread (xxh3 releases the GIL) was measured slower: the helper waits
for the GIL to come back until the 5 ms switch interval forces it, so for
32 MiB in 8 chunks the checks finished after the last copy anyway (9.3 ms
vs 6.7 ms inline: 4.5 ms of copies, 2.2 ms of xxh3).

Large chunks on a machine with cores to spare are fetched by several threads
at once, each copying and checking whole chunks (numpy's copy and xxh3 both
let go of the GIL): one thread reaches ~4 GB/s of copy-and-check, memory
allows far more (H200 host, 8 chunks of 32 MiB: 76 ms on one thread, 13 ms
on eight). A trailer lands on the next chunk's first bytes, so neighbours
never run together: the even chunks first, then the odd ones, which write
their trailers over the first bytes of the even chunks after them -- saved
before and put back after.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InvalidArgument
from ..pool import Pool
from .tensors import TRAILER_BYTES, checksum, recorded_checksum

PARALLEL_MIN_CHUNK_BYTES = 4 << 20
"""Chunks from this size up are fetched in parallel (smaller: thread hand-offs cost more)."""
MAX_THREADS = 8
_pool: ThreadPoolExecutor | None = None


def fetch_chunks(
    pool: Pool, keys: list[str], heads: list[bytes], chunk_bytes: int, buffer: np.ndarray
) -> int:
    """Copy the chunks of ``keys`` back to back into ``buffer``; return how many are good.

    Args:
        pool: where the chunks are.
        keys: their keys, first to last.
        heads: the trailer head each must have (``tensors.trailer_head``).
        chunk_bytes: payload bytes per chunk.
        buffer: uint8, at least ``len(keys)`` payloads long. A chunk whose
            trailer would not fit (no slack after the last one) goes through a
            bounce buffer.
    """
    threads = _threads()
    if threads is None or chunk_bytes < PARALLEL_MIN_CHUNK_BYTES or len(keys) < 2:
        for index in range(len(keys)):
            if not _fetch_one(pool, keys, heads, chunk_bytes, buffer, index):
                return index
        return len(keys)
    keys = keys[: pool.count_present(keys)]  # no reads (or promotions) past a missing chunk
    good = [False] * len(keys)

    def fetch(index: int) -> None:
        good[index] = _fetch_one(pool, keys, heads, chunk_bytes, buffer, index)

    list(threads.map(fetch, range(0, len(keys), 2)))
    firsts = {i: buffer[i * chunk_bytes : i * chunk_bytes + TRAILER_BYTES].copy()
              for i in range(2, len(keys), 2)}  # fmt: skip
    list(threads.map(fetch, range(1, len(keys), 2)))  # their trailers land on those bytes
    for index, saved in firsts.items():
        buffer[index * chunk_bytes : index * chunk_bytes + TRAILER_BYTES] = saved
    return good.index(False) if False in good else len(keys)


def _fetch_one(
    pool: Pool,
    keys: list[str],
    heads: list[bytes],
    chunk_bytes: int,
    buffer: np.ndarray,
    index: int,
) -> bool:
    """Copy chunk ``index`` to its place and check it; a damaged one is deleted."""
    start = index * chunk_bytes
    end = start + chunk_bytes + TRAILER_BYTES
    bounce = end > len(buffer)
    target = np.empty(end - start, np.uint8) if bounce else buffer[start:end]
    try:
        length = pool.get_into(keys[index], target)
    except InvalidArgument:  # larger than a chunk of this layout: not one of ours
        length = -1
    if length is None:
        return False
    head = heads[index]
    payload = target[:chunk_bytes]
    recorded = recorded_checksum(target[chunk_bytes:], head) if length == len(target) else None
    if recorded is None or checksum(payload, head) != recorded:
        pool.delete(keys[index])
        return False
    if bounce:
        buffer[start : start + chunk_bytes] = payload
    return True


def _threads() -> ThreadPoolExecutor | None:
    """The fetch threads, made on first use; None with fewer than four cores to run them."""
    global _pool
    if _pool is None:
        cores = len(os.sched_getaffinity(0))
        if cores < 4:
            return None
        _pool = ThreadPoolExecutor(min(MAX_THREADS, cores // 2), thread_name_prefix="kvcache-fetch")
    return _pool
