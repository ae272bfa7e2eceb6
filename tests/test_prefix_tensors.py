"""Chunk bytes: token-major payload, checked trailer, KV given in either form; reused buffers."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from kvcache import InvalidArgument, KVLayout
from kvcache.prefix import buffers
from kvcache.prefix.tensors import (
    TRAILER_BYTES,
    KVSource,
    checksum,
    chunk_view,
    recorded_checksum,
    seal,
    trailer_head,
)

LAYOUT = KVLayout(num_layers=3, num_kv_heads=2, head_dim=4, dtype="float32")
DIGEST = bytes(range(32))


def stacked_kv(tokens: int, layout: KVLayout = LAYOUT, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (layout.num_layers, 2, layout.num_kv_heads, tokens, layout.head_dim)
    return rng.standard_normal(shape).astype(layout.storage_dtype)


def test_stacked_and_per_layer_kv_give_the_same_token_major_chunk() -> None:
    kv = stacked_kv(10)
    pairs = [(kv[layer, 0], kv[layer, 1]) for layer in range(3)]
    batched = [(k[None], v[None]) for k, v in pairs]
    chunks = []
    for given in (kv, pairs, batched, tuple(pairs)):
        source = KVSource(given, LAYOUT)
        assert source.num_tokens == 10
        dest = chunk_view(np.empty(4 * LAYOUT.token_bytes, np.uint8), LAYOUT, 4)
        source.copy_tokens(4, 8, dest)
        chunks.append(dest.copy())
    for chunk in chunks:
        np.testing.assert_array_equal(chunk, chunks[0])
    # token-major: token t of the chunk holds every layer's K and V for that token
    np.testing.assert_array_equal(chunks[0][1], kv[:, :, :, 5, :])


def test_kv_of_another_dtype_is_refused_not_converted() -> None:
    with pytest.raises(InvalidArgument, match="float16 but the cache holds"):
        KVSource(stacked_kv(4).astype(np.float16), LAYOUT)
    with pytest.raises(InvalidArgument, match="int64"):
        KVSource(np.zeros((3, 2, 2, 4, 4), np.int64), LAYOUT)


def test_bfloat16_is_taken_as_raw_bit_patterns() -> None:
    layout = KVLayout(3, 2, 4, "bfloat16")
    bits = np.arange(3 * 2 * 2 * 4 * 4, dtype=np.uint16).reshape(3, 2, 2, 4, 4)
    source = KVSource(bits.view(np.int16), layout)
    dest = chunk_view(np.empty(4 * layout.token_bytes, np.uint8), layout, 4)
    source.copy_tokens(0, 4, dest)
    np.testing.assert_array_equal(dest.transpose(1, 2, 3, 0, 4), bits)
    with pytest.raises(InvalidArgument, match="bfloat16"):
        KVSource(bits.astype(np.float32), layout)


@pytest.mark.parametrize(
    ("kv", "message"),
    [
        (np.zeros((3, 2, 2, 4), np.float32), "shape"),
        (np.zeros((3, 2, 3, 4, 4), np.float32), "shape"),
        ([(np.zeros((2, 4, 4), np.float32),) * 2] * 2, "2 layers"),
        ([(np.zeros((2, 4, 4), np.float32), np.zeros((2, 5, 4), np.float32))] * 3, "layer 0"),
        ([np.zeros((2, 4, 4), np.float32)] * 3, "pair"),
        (
            [(np.zeros((2, 4, 4), np.float32),) * 2] * 2 + [(np.zeros((2, 5, 4), np.float32),) * 2],
            "different",
        ),
        ([(np.zeros((2, 2, 4, 4), np.float32),) * 2] * 3, "batch of one"),
        ("kv", "but the cache holds"),
    ],
)
def test_malformed_kv(kv: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        KVSource(kv, LAYOUT)


def test_trailer_round_trip_and_any_flipped_byte_is_noticed() -> None:
    tokens = 4
    buffer = np.empty(tokens * LAYOUT.token_bytes + TRAILER_BYTES, np.uint8)
    payload_bytes = tokens * LAYOUT.token_bytes
    buffer[:payload_bytes] = np.random.default_rng(1).integers(0, 256, payload_bytes)
    head = trailer_head(LAYOUT, tokens, 7, DIGEST)
    seal(buffer, head)
    payload, trailer = buffer[:payload_bytes], buffer[payload_bytes:]
    assert recorded_checksum(trailer, head) == checksum(payload, head)
    for position in (0, payload_bytes // 2, payload_bytes - 1):
        damaged = payload.copy()
        damaged[position] ^= 1
        assert checksum(damaged, head) != recorded_checksum(trailer, head)
    # another index, namespace or layout predicts another head
    for other in (
        trailer_head(LAYOUT, tokens, 8, DIGEST),
        trailer_head(LAYOUT, tokens, 7, bytes(32)),
        trailer_head(KVLayout(3, 2, 4, "float16"), tokens * 2, 7, DIGEST),
    ):
        assert recorded_checksum(trailer, other) is None
    assert recorded_checksum(trailer[:-1], head) is None


def test_spare_buffers_come_back_only_when_nothing_views_them() -> None:
    spares = buffers.Spares(max_spare_bytes=64 << 20)
    first = spares.take(8 << 20)
    view = first[16:].view(np.float32)
    address = first.ctypes.data
    del first
    gc.collect()
    assert spares._spares == []  # the view still shows its memory
    del view
    gc.collect()
    assert len(spares._spares) == 1
    again = spares.take(6 << 20)  # fits in the spare: reused
    assert again.ctypes.data == address and len(again) == 6 << 20
    assert spares._spares == []


def test_spares_are_bounded_and_small_buffers_are_plain() -> None:
    spares = buffers.Spares(max_spare_bytes=16 << 20)
    taken = [spares.take(8 << 20) for _ in range(3)]
    del taken
    gc.collect()
    assert sum(len(m) for m in spares._spares) <= 16 << 20
    huge = spares.take(32 << 20)  # larger than all spares may be: dropped, not kept
    del huge
    gc.collect()
    assert all(len(m) < 32 << 20 for m in spares._spares)
    small = spares.take(1000)
    assert small.base is None and small.nbytes == 1000
