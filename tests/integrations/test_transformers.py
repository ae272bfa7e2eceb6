"""kvcache.integrations.transformers with a real LlamaForCausalLM (random weights, no downloads)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import CHUNK, VOCAB, prefill, prompt, tiny_llama  # noqa: E402

import kvcache  # noqa: E402
from kvcache import DependencyError, InvalidArgument, KVLayout, PrefixCache  # noqa: E402
from kvcache.integrations import transformers as kvhf  # noqa: E402

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def model() -> transformers.LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def pc(pool: kvcache.Pool, model: transformers.LlamaForCausalLM) -> PrefixCache:
    return kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=CHUNK)


def last_logits_with_reuse(model, pc: PrefixCache, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    cache, n = kvhf.load(pc, ids)
    logits = model(ids[:, n:], **{kvhf.CACHE_KEYWORD: cache}, use_cache=True).logits[0, -1]
    return logits, n


def last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits[0, -1]


# ------------------------------------------------------------------ correctness


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize(
    ("length", "expected_n"),
    [(40, 39), (37, 32), (20, 16), (9, 8), (8, 7)],
    ids=[
        "whole-stored-prompt",
        "within-last-chunk",
        "shorter-prefix",
        "one-chunk",
        "one-chunk-exact",
    ],
)
def test_logits_after_restoring_match_a_full_prefill(
    pool: kvcache.Pool, attn: str, length: int, expected_n: int
) -> None:
    model = tiny_llama(attn=attn)
    pc = kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=CHUNK)
    stored = prompt(40)
    assert kvhf.save(pc, stored, prefill(model, stored)) == 40
    ids = stored[:, :length]
    reused, n = last_logits_with_reuse(model, pc, ids)
    assert n == expected_n
    full = last_logits(model, ids)
    torch.testing.assert_close(reused, full, atol=1e-4, rtol=0)
    assert reused.argmax() == full.argmax()


def test_the_restored_cache_never_covers_the_whole_prompt(pc: PrefixCache, model) -> None:
    ids = prompt(32)
    kvhf.save(pc, ids, prefill(model, ids))
    for length in (32, 16, 8):  # whole chunks: the last token is still left to compute
        cache, n = kvhf.load(pc, ids[:, :length])
        assert n == length - 1 and cache.get_seq_length() == n
    assert kvhf.load(pc, ids[:, :7])[1] == 0
    assert kvhf.load(pc, ids[:, :1])[1] == 0
    assert kvhf.load(pc, ids[0, :0])[1] == 0


def test_loading_makes_views_not_copies(pc: PrefixCache, model) -> None:
    ids = prompt(32)
    kvhf.save(pc, ids, prefill(model, ids))
    cache, n = kvhf.load(pc, ids)
    pointers = {
        tensor.untyped_storage().data_ptr()
        for layer in cache.layers
        for tensor in (layer.keys, layer.values)
    }
    assert len(pointers) == 1  # every layer views the one array the pool was copied into
    assert cache.layers[0].keys.shape == (1, 2, n, 16)


def test_generate_gives_the_same_tokens_with_and_without_reuse(pc: PrefixCache, model) -> None:
    ids = prompt(45)
    expected = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert pc.lookup(ids) == 0
    assert torch.equal(kvhf.generate(model, pc, ids, max_new_tokens=12, do_sample=False), expected)
    assert pc.lookup(expected[0]) == 56  # the prompt and the answer, 56 of 56 tokens with KV
    assert torch.equal(kvhf.generate(model, pc, ids, max_new_tokens=12, do_sample=False), expected)
    # the next turn of the conversation reuses prompt and answer
    follow_up = torch.cat([expected, prompt(10, seed=2)], dim=1)
    reused = kvhf.generate(
        model, pc, follow_up, max_new_tokens=6, do_sample=False, return_dict_in_generate=True
    )
    assert torch.equal(
        reused.sequences, model.generate(follow_up, max_new_tokens=6, do_sample=False)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_caches_round_trip_bit_for_bit(pool: kvcache.Pool, dtype) -> None:
    model = tiny_llama(dtype=dtype)
    pc = kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=CHUNK)
    assert pc.layout.dtype == str(dtype).removeprefix("torch.")
    ids = prompt(24)
    original = prefill(model, ids)
    kvhf.save(pc, ids, original)
    cache, n = kvhf.load(pc, torch.cat([ids, prompt(1)], dim=1))
    assert n == 24
    for mine, theirs in zip(cache.layers, original.layers, strict=True):
        assert mine.keys.dtype == dtype
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


# ------------------------------------------------------------------- isolation


def test_other_models_layouts_and_dtypes_never_hit(
    pool: kvcache.Pool, pc: PrefixCache, model
) -> None:
    ids = prompt(32)
    kvhf.save(pc, ids, prefill(model, ids))
    assert kvhf.load(pc, ids)[1] == 31
    others = [
        kvhf.prefix_cache(pool, model, model_id="another-model", chunk_tokens=CHUNK),
        kvhf.prefix_cache(pool, model, model_id="tiny-llama", chunk_tokens=CHUNK, salt="tenant"),
        kvhf.prefix_cache(pool, tiny_llama(layers=3), model_id="tiny-llama", chunk_tokens=CHUNK),
        kvhf.prefix_cache(pool, tiny_llama(kv_heads=4), model_id="tiny-llama", chunk_tokens=CHUNK),
        kvhf.prefix_cache(
            pool, tiny_llama(dtype=torch.bfloat16), model_id="tiny-llama", chunk_tokens=CHUNK
        ),
    ]
    for other in others:
        assert other.lookup(ids) == 0
        assert kvhf.load(other, ids)[1] == 0


# ------------------------------------------------------------ eviction, damage


def test_evicting_a_middle_chunk_shortens_the_hit(pc: PrefixCache, model) -> None:
    ids = prompt(40)
    kvhf.save(pc, ids, prefill(model, ids))
    pc.pool.delete(pc.chunk_keys(ids)[2])
    reused, n = last_logits_with_reuse(model, pc, ids)
    assert n == 16
    torch.testing.assert_close(reused, last_logits(model, ids), atol=1e-4, rtol=0)


def test_a_corrupted_chunk_is_a_miss(pc: PrefixCache, model) -> None:
    ids = prompt(40)
    kvhf.save(pc, ids, prefill(model, ids))
    key = pc.chunk_keys(ids)[1]
    value = bytearray(pc.pool.get(key))
    value[100] ^= 0x01  # one bit of one key element
    pc.pool.put(key, bytes(value))
    reused, n = last_logits_with_reuse(model, pc, ids)
    assert n == 8
    torch.testing.assert_close(reused, last_logits(model, ids), atol=1e-4, rtol=0)
    assert key not in pc.pool


# ---------------------------------------------------------------- torch in core


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_cache_takes_and_fills_torch_tensors(pool: kvcache.Pool, dtype) -> None:
    name = str(dtype).removeprefix("torch.")
    pc = PrefixCache(pool, "m", KVLayout(2, 2, 4, name), chunk_tokens=4)
    kv = torch.randn(2, 2, 2, 10, 4).to(dtype)
    tokens = torch.arange(10)
    assert pc.store(tokens, kv) == 8
    out = torch.empty(8, 2, 2, 2, 4, dtype=dtype)  # token-major
    got, n = pc.retrieve(tokens, out=out)
    assert n == 8 and isinstance(got, torch.Tensor) and got.dtype == dtype
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, kv[:, :, :, :8])
    as_numpy, _ = pc.retrieve(tokens.tolist())  # bfloat16 comes back as its bit patterns
    assert np.array_equal(as_numpy, kv[:, :, :, :8].view(torch.int16).numpy().view(np.uint16)
                          if dtype == torch.bfloat16 else kv[:, :, :, :8].numpy())  # fmt: skip


def test_tensors_of_another_dtype_or_device_are_refused(pool: kvcache.Pool) -> None:
    pc = PrefixCache(pool, "m", KVLayout(2, 2, 4, "bfloat16"), chunk_tokens=4)
    with pytest.raises(InvalidArgument, match="float32 but the cache holds"):
        pc.store(torch.arange(8), torch.zeros(2, 2, 2, 8, 4))
    with pytest.raises(InvalidArgument, match="meta"):
        pc.store(torch.arange(8), torch.zeros(2, 2, 2, 8, 4, dtype=torch.bfloat16, device="meta"))


# ---------------------------------------------------------------------- misuse


def test_one_sequence_at_a_time(pc: PrefixCache, model) -> None:
    batch = torch.cat([prompt(16), prompt(16, seed=2)])
    with pytest.raises(InvalidArgument, match="one sequence"):
        kvhf.load(pc, batch)
    with pytest.raises(InvalidArgument, match="batch of 2"):
        kvhf.save(pc, batch[0], prefill(model, batch))
    with pytest.raises(InvalidArgument, match="one prompt at a time"):
        kvhf.generate(model, pc, batch, max_new_tokens=2)


def test_generate_refuses_a_cache_of_its_own_and_a_foreign_layout(pc: PrefixCache, model) -> None:
    ids = prompt(16)
    with pytest.raises(InvalidArgument, match="makes the cache itself"):
        kvhf.generate(model, pc, ids, **{kvhf.CACHE_KEYWORD: transformers.DynamicCache()})
    with pytest.raises(InvalidArgument, match="makes the cache itself"):
        kvhf.generate(model, pc, ids, use_cache=False)
    with pytest.raises(InvalidArgument, match="layout"):
        kvhf.generate(tiny_llama(layers=3), pc, ids, max_new_tokens=2)


def test_a_model_needs_a_name(pool: kvcache.Pool, model) -> None:
    with pytest.raises(InvalidArgument, match="model_id"):
        kvhf.prefix_cache(pool, model)


def test_sliding_window_models_are_refused(pool: kvcache.Pool) -> None:
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, sliding_window=16,
    )  # fmt: skip
    mistral = transformers.MistralForCausalLM(config)
    with pytest.raises(InvalidArgument, match="DynamicSlidingWindowLayer"):
        kvhf.prefix_cache(pool, mistral, model_id="mistral")


@pytest.mark.parametrize("version", ["4.55.4", "4.50.0", "5.26.0", "6.0.0", "3.5.1", "dev"])
def test_unsupported_transformers_versions_fail_clearly(version: str) -> None:
    with pytest.raises(DependencyError, match=r"transformers>=4\.56,<5\.26.*pip install"):
        kvhf._check_version(version)


@pytest.mark.parametrize(
    "version", ["4.56.0", "4.57.6", "5.0.0", "5.24.0", "5.25.0", "5.25.1.dev0"]
)
def test_supported_versions(version: str) -> None:
    kvhf._check_version(version)


def test_the_cache_keyword_is_the_one_this_release_takes() -> None:
    """A keyword forward does not know would vanish into **kwargs: the cache unused."""
    major_minor = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    expected = "cache" if major_minor >= (5, 24) else "past_key_values"
    assert expected == kvhf.CACHE_KEYWORD
    forward = inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    assert kvhf.CACHE_KEYWORD in forward


def test_a_model_whose_forward_lacks_the_keyword_is_refused(pool: kvcache.Pool) -> None:
    class OldSignature(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, other_cache=None, **kwargs):  # type: ignore[override]
            return super().forward(input_ids, **kwargs)

    old = OldSignature(tiny_llama().config)
    with pytest.raises(InvalidArgument, match=f"does not take {kvhf.CACHE_KEYWORD}="):
        kvhf.prefix_cache(pool, old, model_id="old")


def test_a_release_in_range_without_the_cache_api_fails_clearly(monkeypatch) -> None:
    class OldLayer:  # as 4.54-4.55: a DynamicLayer without lazy_initialization
        pass

    monkeypatch.setattr(kvhf, "DynamicLayer", OldLayer)
    with pytest.raises(DependencyError, match=r"lacks the cache API.*pip install"):
        kvhf._detect_flavor()
