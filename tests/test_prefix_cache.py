"""PrefixCache: store / lookup / retrieve by prompt, longest good prefix, never wrong data."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument, KVLayout, PrefixCache, ValueTooLargeError
from kvcache.prefix import fetch

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
CHUNK = 4


def make_kv(tokens: int, layout: KVLayout = LAYOUT, seed: int = 0) -> np.ndarray:
    """Random KV (layers, 2, heads, tokens, dim); bfloat16 as random bit patterns."""
    rng = np.random.default_rng(seed)
    shape = (layout.num_layers, 2, layout.num_kv_heads, tokens, layout.head_dim)
    if layout.dtype == "bfloat16":
        return rng.integers(0, 1 << 16, shape, dtype=np.uint16)
    return rng.standard_normal(shape).astype(layout.storage_dtype)


@pytest.fixture(autouse=True, params=["in-order", "parallel"])
def fetch_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test both ways: chunk by chunk, and by the parallel path of many-core hosts
    (forced here, with real threads, whatever this machine's cores and the chunk size)."""
    if request.param == "in-order":
        yield
        return
    with ThreadPoolExecutor(2) as threads:
        monkeypatch.setattr(fetch, "_threads", lambda: threads)
        monkeypatch.setattr(fetch, "PARALLEL_MIN_CHUNK_BYTES", 0)
        yield


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    return make_pool("8M", page_size="4K")


@pytest.fixture
def pc(pool: kvcache.Pool) -> PrefixCache:
    return PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)


TOKENS = np.arange(1000, 1018)  # 4 full chunks and 2 tokens over
KV = make_kv(18)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_is_exact(pool: kvcache.Pool, dtype: str) -> None:
    layout = dataclasses.replace(LAYOUT, dtype=dtype)
    pc = PrefixCache(pool, "model-a", layout, chunk_tokens=CHUNK)
    kv = make_kv(18, layout)
    assert pc.store(TOKENS, kv) == 16
    assert pc.lookup(TOKENS) == 16
    got, n = pc.retrieve(TOKENS)
    assert n == 16
    assert got.shape == (2, 2, 2, 16, 8) and got.dtype == layout.storage_dtype
    np.testing.assert_array_equal(got, kv[:, :, :, :16])


def test_only_full_chunks_are_cached_and_lookup_counts_tokens(pc: PrefixCache) -> None:
    assert pc.store(TOKENS[:7], KV) == 4
    assert pc.lookup(TOKENS) == 4
    assert pc.lookup(TOKENS[:3]) == 0
    assert pc.store(TOKENS, KV) == 12  # chunk 0 was there already
    assert pc.store(TOKENS, KV) == 0
    assert pc.lookup(TOKENS) == 16


def test_a_prefix_shorter_or_longer_than_what_was_stored(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    kv, n = pc.retrieve(TOKENS[:10])  # shorter: its 2 full chunks
    assert n == 8
    np.testing.assert_array_equal(kv, KV[:, :, :, :8])
    longer = np.r_[TOKENS, np.arange(30)]
    assert pc.lookup(longer) == 16
    kv, n = pc.retrieve(longer)
    assert n == 16
    np.testing.assert_array_equal(kv, KV[:, :, :, :16])


def test_a_different_token_ends_the_prefix(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    other = TOKENS.copy()
    other[9] = 7  # in chunk 2
    assert pc.lookup(other) == 8
    assert pc.retrieve(other)[1] == 8
    other[0] = 7
    assert pc.lookup(other) == 0


def test_a_miss_is_an_empty_array(pc: PrefixCache) -> None:
    kv, n = pc.retrieve(TOKENS)
    assert n == 0 and kv.shape == (2, 2, 2, 0, 8)
    assert pc.retrieve([])[1] == 0


def test_max_tokens(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    assert pc.retrieve(TOKENS, max_tokens=11)[1] == 8
    assert pc.retrieve(TOKENS, max_tokens=0)[1] == 0
    with pytest.raises(InvalidArgument, match="max_tokens"):
        pc.retrieve(TOKENS, max_tokens=-1)


def test_retrieve_from_a_first_token_reads_only_the_chunks_from_there(pc: PrefixCache) -> None:
    """The caller holds the first chunks (an engine's own cache): they are not read, even
    when gone, and the counters count only the tokens asked of the pool."""
    pc.store(TOKENS, KV)
    pc.pool.delete(pc.chunk_keys(TOKENS)[0])
    kv, n = pc.retrieve(TOKENS, first_token=8)
    assert n == 16
    np.testing.assert_array_equal(kv, KV[:, :, :, 8:16])
    out = np.full((8, 2, 2, 2, 8), -1.0, np.float32)  # room for two chunks from token 4
    kv, n = pc.retrieve(TOKENS, out=out, first_token=4)
    assert n == 12
    np.testing.assert_array_equal(out[:8].transpose(1, 2, 3, 0, 4), KV[:, :, :, 4:12])
    assert pc.retrieve(TOKENS, first_token=16)[1] == 16  # nothing past it: an empty hit there
    assert pc.retrieve(TOKENS, first_token=8, max_tokens=4)[1] == 4
    counts = pc.pool.metrics().tokens["model-a"]
    assert (counts.queried, counts.hit) == (10 + 14 + 2 + 10, 8 + 8 + 0 + 0)
    pc.pool.delete(pc.chunk_keys(TOKENS)[2])
    kv, n = pc.retrieve(TOKENS, first_token=8)
    assert n == 8 and kv.shape[3] == 0
    with pytest.raises(InvalidArgument, match="multiple of chunk_tokens"):
        pc.retrieve(TOKENS, first_token=6)
    with pytest.raises(InvalidArgument, match="first_token"):
        pc.retrieve(TOKENS, first_token=20)


def test_kv_may_cover_more_tokens_but_not_fewer(pc: PrefixCache) -> None:
    assert pc.store(TOKENS[:8], KV) == 8
    with pytest.raises(InvalidArgument, match="covers 8 tokens"):
        pc.store(TOKENS, KV[:, :, :, :8])


def test_per_layer_pairs_are_stored_like_one_array(pc: PrefixCache) -> None:
    pairs = [(KV[layer, 0][None], KV[layer, 1][None]) for layer in range(2)]
    pc.store(TOKENS, pairs)
    np.testing.assert_array_equal(pc.retrieve(TOKENS)[0], KV[:, :, :, :16])


# ----------------------------------------------------------------- out= buffers


def test_retrieve_into_a_new_buffer_fills_it_in_place(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    out = pc.new_buffer(32)
    assert out.shape == (2, 2, 2, 32, 8)
    kv, n = pc.retrieve(TOKENS, out=out)
    assert n == 16 and np.shares_memory(kv, out)
    np.testing.assert_array_equal(out[:, :, :, :16], KV[:, :, :, :16])


@pytest.mark.parametrize("capacity", [16, 17, 12])
def test_retrieve_into_a_token_major_array(pc: PrefixCache, capacity: int) -> None:
    """Exactly the hit's size (no slack for the last trailer), a little more, or less."""
    pc.store(TOKENS, KV)
    out = np.full((capacity, 2, 2, 2, 8), -1.0, np.float32)
    kv, n = pc.retrieve(TOKENS, out=out)
    assert n == min(16, capacity // CHUNK * CHUNK)
    np.testing.assert_array_equal(kv, KV[:, :, :, :n])
    np.testing.assert_array_equal(out[:n].transpose(1, 2, 3, 0, 4), KV[:, :, :, :n])


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (np.zeros((16, 2, 2, 2, 8), np.float16), "float16"),
        (np.zeros((16, 2, 2, 3, 8), np.float32), "shape"),
        (np.zeros((2, 2, 2, 16, 8), np.float32), "shape"),  # logical shape, wrong memory order
        (np.zeros((16, 2, 2, 2, 8), np.float32)[::2], "shape"),
    ],
)
def test_unusable_out_buffers(pc: PrefixCache, out: np.ndarray, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        pc.retrieve(TOKENS, out=out)


def test_read_only_out_buffer(pc: PrefixCache) -> None:
    out = np.zeros((16, 2, 2, 2, 8), np.float32)
    out.flags.writeable = False
    with pytest.raises(InvalidArgument, match="writable"):
        pc.retrieve(TOKENS, out=out)


# ---------------------------------------------- eviction, races, damage, isolation


def test_a_missing_middle_chunk_ends_the_hit(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    keys = pc.chunk_keys(TOKENS)
    pc.pool.delete(keys[2])
    assert pc.lookup(TOKENS) == 8
    kv, n = pc.retrieve(TOKENS)
    assert n == 8
    np.testing.assert_array_equal(kv, KV[:, :, :, :8])
    assert pc.store(TOKENS, KV) == 4  # the gap is filled again
    assert pc.lookup(TOKENS) == 16


def test_evicted_by_the_pool_policy(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("64K", page_size="4K", policy="priority")
    pc = PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)
    pc.store(TOKENS, KV, priority=5)
    pool.delete(pc.chunk_keys(TOKENS)[1])
    pool.put("filler", b"x" * 1000, priority=9)
    pc.store(TOKENS[:8], KV, priority=-1)  # chunk 1 again, now the first victim
    pool.put("big", b"x" * (pool.stats().free_bytes + 1), priority=9)  # evicts one page
    assert pc.lookup(TOKENS) == 4
    assert pc.retrieve(TOKENS)[1] == 4


def test_a_chunk_evicted_between_lookup_and_retrieve_shortens_the_hit(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    assert pc.lookup(TOKENS) == 16
    pc.pool.delete(pc.chunk_keys(TOKENS)[1])  # another process's eviction, in between
    kv, n = pc.retrieve(TOKENS)
    assert n == 4
    np.testing.assert_array_equal(kv, KV[:, :, :, :4])


def _rewrite(pool: kvcache.Pool, key: str, change: Callable[[bytearray], bytes]) -> None:
    value = pool.get(key)
    assert isinstance(value, bytes)
    pool.put(key, change(bytearray(value)))


def _flip(position: int) -> Callable[[bytearray], bytes]:
    def change(value: bytearray) -> bytes:
        value[position] ^= 0x10
        return bytes(value)

    return change


@pytest.mark.parametrize(
    "change",
    [
        _flip(0),  # first payload byte
        _flip(CHUNK * LAYOUT.token_bytes - 1),  # last payload byte
        _flip(CHUNK * LAYOUT.token_bytes + 40),  # namespace digest in the trailer
        _flip(-1),  # the recorded checksum
        lambda value: bytes(value[:-1]),  # truncated
        lambda value: bytes(value) + b"\0",  # too long
        lambda value: b"",
    ],
    ids=[
        "payload-first",
        "payload-last",
        "trailer-namespace",
        "checksum",
        "short",
        "long",
        "empty",
    ],
)
def test_a_damaged_chunk_is_a_miss_and_is_dropped(
    pc: PrefixCache, change: Callable[[bytearray], bytes]
) -> None:
    pc.store(TOKENS, KV)
    keys = pc.chunk_keys(TOKENS)
    _rewrite(pc.pool, keys[1], change)
    kv, n = pc.retrieve(TOKENS)
    assert n == 4
    np.testing.assert_array_equal(kv, KV[:, :, :, :4])
    assert keys[1] not in pc.pool  # dropped, so that the next store mends it
    assert pc.store(TOKENS, KV) == 4
    assert pc.retrieve(TOKENS)[1] == 16


def test_a_damaged_last_chunk_read_through_the_bounce_buffer(pc: PrefixCache) -> None:
    pc.store(TOKENS, KV)
    _rewrite(pc.pool, pc.chunk_keys(TOKENS)[3], _flip(5))
    out = np.zeros((16, 2, 2, 2, 8), np.float32)  # no slack: the last chunk is bounced
    assert pc.retrieve(TOKENS, out=out)[1] == 12


def test_a_chunk_of_another_namespace_under_our_key_is_a_miss(pool: kvcache.Pool) -> None:
    ours = PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)
    theirs = PrefixCache(pool, "model-b", LAYOUT, chunk_tokens=CHUNK)
    theirs.store(TOKENS, KV)
    ours.store(TOKENS, make_kv(18, seed=1))
    # a foreign writer copies model-b's chunk 0 over model-a's
    pool.put(ours.chunk_keys(TOKENS)[0], pool.get(theirs.chunk_keys(TOKENS)[0]))
    assert ours.retrieve(TOKENS)[1] == 0


@pytest.mark.parametrize(
    "other",
    [
        {"model": "model-b"},
        {"layout": dataclasses.replace(LAYOUT, num_layers=3)},
        {"layout": dataclasses.replace(LAYOUT, num_kv_heads=1)},
        {"layout": dataclasses.replace(LAYOUT, head_dim=4)},
        {"layout": dataclasses.replace(LAYOUT, dtype="float16")},
        {"layout": dataclasses.replace(LAYOUT, dtype="bfloat16")},
        {"salt": "tenant-2"},
        {"chunk_tokens": 2},
    ],
    ids=["model", "layers", "kv_heads", "head_dim", "float16", "bfloat16", "salt", "chunk"],
)
def test_other_namespaces_never_hit(pool: kvcache.Pool, other: dict[str, object]) -> None:
    PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK, salt="tenant-1").store(TOKENS, KV)
    fields: dict[str, object] = {
        "model": "model-a", "layout": LAYOUT, "chunk_tokens": CHUNK, "salt": "tenant-1", **other,
    }  # fmt: skip
    model, layout = fields.pop("model"), fields.pop("layout")
    pc = PrefixCache(pool, model, layout, **fields)  # type: ignore[arg-type]
    assert pc.lookup(TOKENS) == 0
    assert pc.retrieve(TOKENS)[1] == 0


def test_ttl_and_priority_reach_the_pool(make_pool: Callable[..., kvcache.Pool], clock) -> None:
    pool = make_pool("1M", page_size="4K", clock=clock)
    pc = PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)
    pc.store(TOKENS, KV, ttl=60, priority=3)
    assert {entry.priority for entry in pool.entries()} == {3}
    clock.advance(61)
    assert pc.lookup(TOKENS) == 0
    assert pc.retrieve(TOKENS)[1] == 0


def test_large_chunks_copied_outside_the_lock(make_pool: Callable[..., kvcache.Pool]) -> None:
    layout = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float16")
    pool = make_pool("16M")
    pc = PrefixCache(pool, "model-a", layout, chunk_tokens=32)  # 256 KiB chunks
    kv = make_kv(100, layout)
    tokens = np.arange(100)
    assert pc.store(tokens, kv) == 96
    got, n = pc.retrieve(tokens)
    assert n == 96
    np.testing.assert_array_equal(got, kv[:, :, :, :96])


def test_a_chunk_larger_than_the_pool(make_pool: Callable[..., kvcache.Pool]) -> None:
    pool = make_pool("64K", page_size="4K")
    pc = PrefixCache(pool, "model-a", LAYOUT, chunk_tokens=512)
    with pytest.raises(ValueTooLargeError, match="smaller chunks"):
        pc.store(np.arange(512), make_kv(512))


def test_bad_arguments(pool: kvcache.Pool) -> None:
    with pytest.raises(InvalidArgument, match="Pool"):
        PrefixCache("pool", "m", LAYOUT)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="KVLayout"):
        PrefixCache(pool, "m", (2, 2, 8))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="num_tokens"):
        PrefixCache(pool, "m", LAYOUT).new_buffer(-1)
    assert "model-a" in repr(PrefixCache(pool, "model-a", LAYOUT))


def test_importing_kvcache_does_not_import_torch() -> None:
    script = "import sys, kvcache; kvcache.PrefixCache; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", script], check=True)
