"""kvcache.integrations.llama_cpp with a real llama.cpp model (random weights, written here)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed: pip install 'kvcache[llama-cpp]' "
    "(scripts/setup.sh builds it into .venv)",
)
pytest.importorskip("gguf", reason="gguf is not installed: pip install 'kvcache[llama-cpp]'")

import kvcache  # noqa: E402
from kvcache import DependencyError, InvalidArgument  # noqa: E402
from kvcache.integrations import llama_cpp as kvllama  # noqa: E402
from kvcache.integrations.gguf_model import ModelShape, write_model  # noqa: E402
from kvcache.prefix.keys import STATE_KEY_PREFIX  # noqa: E402

N_CTX = 512
CHUNK = 16
SYSTEM = "the system prompt says the assistant answers each question about shared memory " * 3


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("model") / "tiny.gguf", ModelShape())


def new_llama(model_path: Path, **kwargs: object) -> llama_cpp.Llama:
    options: dict[str, object] = dict(n_ctx=N_CTX, n_batch=64, n_threads=1, seed=0, verbose=False)
    return llama_cpp.Llama(model_path=str(model_path), **{**options, **kwargs})


@pytest.fixture(scope="module")
def llm(model_path: Path) -> Iterator[llama_cpp.Llama]:
    llama = new_llama(model_path)
    yield llama
    llama.close()


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    return make_pool("16M", page_size="4K")


@pytest.fixture
def cache(pool: kvcache.Pool, llm: llama_cpp.Llama) -> kvllama.PoolCache:
    return kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)


def evaluated(llm: llama_cpp.Llama, text: str) -> tuple[list[int], llama_cpp.LlamaState]:
    """The tokens of ``text`` and the state after evaluating them from an empty context."""
    tokens = llm.tokenize(text.encode())
    llm.reset()
    llm.eval(tokens)
    return tokens, llm.save_state()


def greedy(llm: llama_cpp.Llama, prompt: str) -> str:
    out = llm(prompt, max_tokens=12, temperature=0.0, seed=0)
    return out["choices"][0]["text"]  # type: ignore[index]


def test_the_generated_model_loads_and_tokenizes(llm: llama_cpp.Llama) -> None:
    tokens = llm.tokenize(b"the cache")
    assert tokens[0] == llm.token_bos() and len(tokens) >= 3
    assert llm.detokenize(tokens[1:]).strip() == b"the cache"


def test_set_get_contains_round_trip(cache: kvllama.PoolCache, llm: llama_cpp.Llama) -> None:
    tokens, state = evaluated(llm, SYSTEM)
    assert tokens not in cache
    cache[tokens] = state
    assert tokens in cache
    got = cache[tokens]
    assert got.n_tokens == state.n_tokens == len(tokens)
    assert got.input_ids[: got.n_tokens].tolist() == tokens
    assert len(got.input_ids) == len(state.input_ids) == N_CTX
    assert bytes(got.llama_state) == bytes(state.llama_state)
    assert got.llama_state_size == state.llama_state_size and got.seed == state.seed
    assert got.scores.shape == state.scores.shape  # no logits_all: zeros, not stored
    llm.reset()
    llm.load_state(got)
    assert llm.n_tokens == len(tokens)


def test_the_longest_shared_prefix_is_found(cache: kvllama.PoolCache, llm: llama_cpp.Llama) -> None:
    short, short_state = evaluated(llm, SYSTEM[:120])
    long, long_state = evaluated(llm, SYSTEM + "first question")
    cache[short] = short_state
    cache[long] = long_state
    query = llm.tokenize((SYSTEM + "another one").encode())
    found = cache[query]
    assert found.n_tokens == len(long)
    assert cache._find_longest_prefix_key(tuple(query)) == tuple(long)
    other = llm.tokenize(b"nothing in common with what is stored, not one full chunk of it")
    with pytest.raises(KeyError):
        cache[other]
    assert other not in cache


def test_a_state_is_found_by_another_process(
    cache: kvllama.PoolCache, llm: llama_cpp.Llama, model_path: Path, pool: kvcache.Pool
) -> None:
    """Another process completes a prompt with the cache; this one finds its state."""
    run_in_another_process(pool.name, model_path, SYSTEM + "first question")
    query = llm.tokenize((SYSTEM + "second question").encode())
    found = cache[query]
    shared = llama_cpp.Llama.longest_token_prefix(found.input_ids.tolist(), query)
    assert shared >= len(llm.tokenize(SYSTEM.encode())) - 1


def test_each_completion_counts_its_prompt_tokens_once(
    pool: kvcache.Pool, model_path: Path
) -> None:
    """Llama reads the cache once per completion: queried grows by the prompt, hit by
    what the stored state shares with it, stored by the state Llama files."""
    llm = new_llama(model_path)
    try:
        cache = kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)
        llm.set_cache(cache)
        first, second = SYSTEM + "first question", SYSTEM + "second question"
        greedy(llm, first)
        counts = pool.metrics().tokens[cache.states.namespace.model]
        first_tokens = len(llm.tokenize(first.encode()))
        assert (counts.queried, counts.hit) == (first_tokens, 0)
        assert counts.stored >= first_tokens  # the prompt and all but the last token generated
        greedy(llm, second)
        counts = pool.metrics().tokens[cache.states.namespace.model]
        assert counts.queried == first_tokens + len(llm.tokenize(second.encode()))
        assert counts.hit >= len(llm.tokenize(SYSTEM.encode())) - 1
    finally:
        llm.close()


def run_in_another_process(pool_name: str, model_path: Path, prompt: str) -> None:
    code = f"""
import kvcache, llama_cpp
from kvcache.integrations import llama_cpp as kvllama
llm = llama_cpp.Llama(model_path={str(model_path)!r}, n_ctx={N_CTX}, n_batch=64, n_threads=1,
                      seed=0, verbose=False)
llm.set_cache(kvllama.PoolCache(kvcache.open({pool_name!r}), llama=llm, chunk_tokens={CHUNK}))
llm({prompt!r}, max_tokens=4, temperature=0.0, seed=0)
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_greedy_tokens_are_the_same_with_and_without_a_cached_prefix(
    pool: kvcache.Pool, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = SYSTEM + "first question", SYSTEM + "second question"
    plain = new_llama(model_path)
    expected = [greedy(plain, first), greedy(plain, second)]
    plain.close()
    run_in_another_process(pool.name, model_path, first)
    cached = new_llama(model_path)
    cache = kvllama.PoolCache(pool, llama=cached, chunk_tokens=CHUNK)
    hits: list[int] = []
    get = kvllama.PoolCache.__getitem__
    monkeypatch.setattr(
        kvllama.PoolCache, "__getitem__", lambda self, key: hits.append(1) or get(self, key)
    )
    cached.set_cache(cache)
    assert greedy(cached, first) == expected[0]  # the same prompt, from the other process
    cached.reset()
    assert greedy(cached, second) == expected[1]  # a new question after the shared prefix
    assert len(hits) == 2
    cached.close()


def test_the_cache_survives_persist_and_restore(
    pool: kvcache.Pool, llm: llama_cpp.Llama, model_path: Path
) -> None:
    tokens, state = evaluated(llm, SYSTEM)
    kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)[tokens] = state
    name = pool.name
    kvcache.persist(pool)
    pool.close()
    kvcache.destroy(name)
    restored = kvcache.restore(name)
    try:
        found = kvllama.PoolCache(restored, llama=llm, chunk_tokens=CHUNK)[[*tokens, 5, 6]]
        assert bytes(found.llama_state) == bytes(state.llama_state)
    finally:
        restored.close()


def record_keys(pool: kvcache.Pool) -> list[str]:
    return [k for k in pool if isinstance(k, str) and k.startswith(STATE_KEY_PREFIX)]


@pytest.mark.parametrize("where", ["header", "tokens", "payload header", "state", "truncated"])
def test_a_damaged_record_is_a_miss(
    cache: kvllama.PoolCache, pool: kvcache.Pool, llm: llama_cpp.Llama, where: str
) -> None:
    tokens, state = evaluated(llm, SYSTEM)
    cache[tokens] = state
    (record,) = [k for k in record_keys(pool) if ":t" in k]
    value = bytearray(pool[record])  # type: ignore[arg-type]
    at = {"header": 9, "tokens": 70, "payload header": 64 + 8 * len(tokens) + 20, "state": -5}
    if where == "truncated":
        del value[-100:]
    else:
        value[at[where]] ^= 0x10
    pool.put(record, bytes(value))
    with pytest.raises(KeyError):
        cache[tokens]
    assert tokens not in cache


def test_a_payload_that_does_not_parse_is_a_miss(pool: kvcache.Pool, llm: llama_cpp.Llama) -> None:
    """Checksummed but not a LlamaState (a foreign writer on the same keys): a miss."""
    cache = kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)
    tokens = llm.tokenize(SYSTEM.encode())
    cache.states.put(tokens, [b"KVLL" + bytes(100)])
    with pytest.raises(KeyError):
        cache[tokens]


def test_capacity_is_the_pools(
    make_pool: Callable[..., kvcache.Pool], llm: llama_cpp.Llama
) -> None:
    small = make_pool("1M", page_size="4K")
    cache = kvllama.PoolCache(small, llama=llm, chunk_tokens=CHUNK)
    assert cache.capacity_bytes == small.config.size_bytes
    stored = []
    for i in range(40):
        tokens, state = evaluated(llm, f"question {i} " + SYSTEM[:200])
        cache[tokens] = state
        stored.append(tokens)
        assert cache.cache_size <= cache.capacity_bytes
    assert stored[-1] in cache
    assert stored[0] not in cache  # evicted to make room
    assert 0 < cache.cache_size <= cache.capacity_bytes


def test_a_state_larger_than_the_pool_is_not_cached_with_one_warning(
    make_pool: Callable[..., kvcache.Pool], llm: llama_cpp.Llama
) -> None:
    tiny = make_pool("64K", page_size="4K")
    tokens, state = evaluated(llm, SYSTEM)
    cache = kvllama.PoolCache(tiny, model_id="tiny")
    with pytest.warns(RuntimeWarning, match="larger pool.*not cached"):
        cache[tokens] = state
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per cache
        cache[tokens] = state
    assert tokens not in cache and tiny.stats().num_entries == 0


def test_logits_are_kept_where_the_context_computes_them(
    pool: kvcache.Pool, model_path: Path
) -> None:
    llm = new_llama(model_path, logits_all=True)
    tokens, state = evaluated(llm, SYSTEM)
    for cache in (
        kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK),
        kvllama.PoolCache(pool, model_id="tiny", chunk_tokens=CHUNK),  # settings unknown: kept
    ):
        cache[tokens] = state
        assert np.array_equal(cache[tokens].scores, state.scores)
    llm.close()


def test_keys_name_the_model_and_its_context_settings(
    pool: kvcache.Pool, llm: llama_cpp.Llama, model_path: Path, tmp_path: Path
) -> None:
    tokens, state = evaluated(llm, SYSTEM)
    kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)[tokens] = state
    other_ctx = new_llama(model_path, n_ctx=256)
    assert tokens not in kvllama.PoolCache(pool, llama=other_ctx, chunk_tokens=CHUNK)
    other_ctx.close()
    other_model = new_llama(write_model(tmp_path / "other.gguf", ModelShape(seed=1)))
    assert tokens not in kvllama.PoolCache(pool, llama=other_model, chunk_tokens=CHUNK)
    other_model.close()
    assert tokens not in kvllama.PoolCache(pool, model_id="tiny", chunk_tokens=CHUNK)
    same = kvllama.PoolCache(pool, llama=llm, chunk_tokens=CHUNK)
    assert tokens in same
    assert kvllama.model_file_id(model_path) == same.states.namespace.model


def test_bad_input_is_a_one_line_error(
    pool: kvcache.Pool, cache: kvllama.PoolCache, llm: llama_cpp.Llama
) -> None:
    tokens, state = evaluated(llm, SYSTEM)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: kvllama.PoolCache(pool), "model_id"),
        (lambda: kvllama.PoolCache("pool", model_id="m"), "pool must be"),  # type: ignore[arg-type]
        (lambda: kvllama.PoolCache(pool, llama="llm"), "llama must be"),  # type: ignore[arg-type]
        (lambda: kvllama.PoolCache(pool, model_id=""), "model"),
        (lambda: kvllama.PoolCache(pool, model_id="m", chunk_tokens=0), "chunk_tokens"),
        (lambda: cache.__setitem__(tokens, b"state"), "LlamaState"),  # type: ignore[arg-type]
        (lambda: cache.__setitem__([9, *tokens], state), "other tokens"),
        (lambda: cache[["a", "b"]], "integers"),  # type: ignore[list-item]
    ]
    for call, message in cases:
        with pytest.raises(InvalidArgument, match=message) as info:
            call()
        assert "\n" not in str(info.value)


def test_without_llama_cpp_the_import_is_a_dependency_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.delitem(sys.modules, "kvcache.integrations.llama_cpp")
    with pytest.raises(DependencyError, match=r"pip install 'kvcache\[llama-cpp\]'") as info:
        importlib.import_module("kvcache.integrations.llama_cpp")
    assert "\n" not in str(info.value)
