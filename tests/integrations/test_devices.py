"""KV of models off the CPU: torch's meta device everywhere, CUDA where a GPU is.

The CUDA tests run only when ``torch.cuda.is_available()``: CI has no GPU, so
they are run by hand on a GPU machine (README, "Models on any device"). The
device-independent code of ``kvcache.integrations.devices`` (stacking, the
one transfer, storing from ``first_token``) also runs here with CPU tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import CHUNK, prefill, prompt, tiny_llama  # noqa: E402

import kvcache  # noqa: E402
from kvcache import InvalidArgument, PrefixCache  # noqa: E402
from kvcache.integrations import devices  # noqa: E402
from kvcache.integrations import transformers as kvhf  # noqa: E402

pytestmark = pytest.mark.usefixtures("inference")

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cache_of(pool: kvcache.Pool, model) -> PrefixCache:
    return kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=CHUNK)


def stored_kv(pc: PrefixCache, ids: torch.Tensor) -> np.ndarray:
    kv, n = pc.retrieve(ids)
    return kv[:, :, :, :n].copy()


# ------------------------------------------------------------- any device (here: CPU, meta)


def test_a_model_on_the_meta_device_gets_its_kv_there(pool: kvcache.Pool) -> None:
    model = tiny_llama()
    pc = cache_of(pool, model)
    ids = prompt(30)
    kvhf.save(pc, ids, prefill(model, ids))
    on_meta = tiny_llama().to("meta")
    kvhf.prefix_cache(pool, on_meta, model_id="tiny-llama")  # accepted, like any device
    cache, n = kvhf.load(pc, ids, device=on_meta.device)
    assert n == 24 and cache.get_seq_length() == 24
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            assert tensor.device.type == "meta" and tensor.dtype == torch.float32
            assert tensor.shape == (1, 2, 24, 16)


def test_a_cache_on_the_meta_device_cannot_be_saved(pool: kvcache.Pool) -> None:
    pc = cache_of(pool, tiny_llama())
    pairs = [(torch.zeros(1, 2, 16, 16, device="meta"),) * 2] * 2
    with pytest.raises(InvalidArgument, match="meta device: it holds no values"):
        kvhf.save(pc, prompt(16), pairs)
    assert pc.lookup(prompt(16)) == 0


def test_the_device_path_loads_what_the_cpu_path_loads(pool: kvcache.Pool) -> None:
    model = tiny_llama()
    pc = cache_of(pool, model)
    ids = prompt(37)
    kvhf.save(pc, ids, prefill(model, ids))
    moved = devices.load_to(pc, ids, 36, torch.device("cpu"))  # the generic path, on the CPU
    cache, n = kvhf.load(pc, ids)
    assert moved.shape[3] == n == 32
    for layer, layer_kv in zip(cache.layers, moved, strict=True):
        assert torch.equal(layer.keys[0], layer_kv[0]) and torch.equal(layer.values[0], layer_kv[1])
    assert devices.load_to(pc, ids, 20, torch.device("cpu")).shape[3] == 20  # capped at limit


def test_the_device_path_saves_only_what_the_pool_lacks(pool: kvcache.Pool) -> None:
    model = tiny_llama()
    pc = cache_of(pool, model)
    ids = prompt(43)
    cache = prefill(model, ids)
    pairs = [(layer.keys, layer.values) for layer in cache.layers]
    assert devices.save_from(pc, ids, pairs) == 40  # five chunks, from token 0
    whole = stored_kv(pc, ids)
    for key in pc.chunk_keys(ids)[2:]:
        pool.delete(key)
    # tokens before the cached run are never read again: spoil them to show it
    spoiled = [(k.clone(), v.clone()) for k, v in pairs]
    for keys, values in spoiled:
        keys[:, :, :16] = values[:, :, :16] = float("nan")
    assert devices.save_from(pc, ids, spoiled) == 24
    np.testing.assert_array_equal(stored_kv(pc, ids), whole)
    assert devices.save_from(pc, ids, pairs) == 0  # all there: nothing moves


def test_store_from_a_first_token(pool: kvcache.Pool) -> None:
    model = tiny_llama()
    pc = cache_of(pool, model)
    ids = prompt(32)
    layers = prefill(model, ids).layers
    kv = np.stack([np.stack((layer.keys[0].numpy(), layer.values[0].numpy())) for layer in layers])
    assert pc.store(ids[:, :16], kv) == 16
    assert pc.store(ids, kv[:, :, :, 16:], first_token=16) == 16
    np.testing.assert_array_equal(stored_kv(pc, ids), kv)
    with pytest.raises(InvalidArgument, match="multiple of chunk_tokens"):
        pc.store(ids, kv[:, :, :, 12:], first_token=12)
    with pytest.raises(InvalidArgument, match="first_token"):
        pc.store(ids, kv, first_token=40)
    pool.delete(pc.chunk_keys(ids)[0])
    for key in pc.chunk_keys(ids)[1:]:
        pool.delete(key)
    assert pc.store(ids, kv[:, :, :, 16:], first_token=16) == 0  # chunks 0-1 gone: nothing
    assert pc.lookup(ids) == 0 and not any(k in pool for k in pc.chunk_keys(ids))


# ----------------------------------------------------------------------- CUDA


@cuda
def test_generate_on_a_gpu_gives_the_same_tokens_with_and_without_reuse(
    pool: kvcache.Pool,
) -> None:
    model = tiny_llama().to("cuda")
    pc = cache_of(pool, model)
    ids = prompt(45).to("cuda")
    expected = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(kvhf.generate(model, pc, ids, max_new_tokens=12, do_sample=False), expected)
    assert pc.lookup(expected[0].cpu()) == 56
    assert torch.equal(kvhf.generate(model, pc, ids, max_new_tokens=12, do_sample=False), expected)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kv_saved_on_a_gpu_is_bit_for_bit_what_the_cpu_saves(pool: kvcache.Pool, dtype) -> None:
    model = tiny_llama(dtype=dtype).to("cuda")
    ids = prompt(40)
    cache = prefill(model, ids.to("cuda"))
    on_gpu = cache_of(pool, model)
    on_cpu = kvhf.prefix_cache(pool, model, model_id="saved-on-the-cpu", chunk_tokens=CHUNK)
    assert kvhf.save(on_gpu, ids, cache) == 40
    cpu_pairs = [(layer.keys.cpu(), layer.values.cpu()) for layer in cache.layers]
    assert on_cpu.store(ids, cpu_pairs) == 40
    np.testing.assert_array_equal(stored_kv(on_gpu, ids), stored_kv(on_cpu, ids))
    loaded, n = kvhf.load(on_gpu, ids, device="cuda")
    assert n == 39
    for layer, (keys, values) in zip(loaded.layers, cpu_pairs, strict=True):
        assert layer.keys.device.type == "cuda" and layer.keys.dtype == dtype
        assert torch.equal(layer.keys.cpu(), keys[:, :, :n])
        assert torch.equal(layer.values.cpu(), values[:, :, :n])


@cuda
def test_loads_to_a_gpu_reuse_one_pinned_buffer(pool: kvcache.Pool) -> None:
    model = tiny_llama().to("cuda")
    pc = cache_of(pool, model)
    ids = prompt(40)
    kvhf.save(pc, ids, prefill(model, ids.to("cuda")))
    kvhf.load(pc, ids, device="cuda")
    buffer = devices._pinned.buffer
    assert buffer is not None and buffer.is_pinned()
    kvhf.load(pc, ids[:, :30], device="cuda")
    assert devices._pinned.buffer is buffer
