"""StateCache: whole states on the prefix keys, found by markers, checked like chunks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kvcache
from kvcache import InvalidArgument, KVLayout
from kvcache.prefix import Namespace, StateCache, StateLayout
from kvcache.prefix.keys import STATE_KEY_PREFIX, as_tokens, chunk_keys

CHUNK = 4
LAYOUT = StateLayout.of("engine", n_ctx=512, type_k=1)
SYSTEM = list(range(100, 118))  # 4 full chunks and 2 tokens


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    return make_pool("4M", page_size="4K")


@pytest.fixture
def states(pool: kvcache.Pool) -> StateCache:
    return StateCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)


def payload_of(hit: object) -> bytes:
    assert hit is not None
    return bytes(hit.payload)  # type: ignore[attr-defined]


def test_exact_tokens_round_trip(states: StateCache) -> None:
    key = states.put(SYSTEM, [b"state-", np.arange(3, dtype="<i4")])
    assert key.startswith(STATE_KEY_PREFIX) and f":t{len(SYSTEM)}:" in key
    hit = states.get(SYSTEM)
    assert payload_of(hit) == b"state-" + np.arange(3, dtype="<i4").tobytes()
    assert hit is not None and hit.num_shared == len(SYSTEM)
    assert hit.tokens.tolist() == SYSTEM


def test_a_prompt_sharing_full_chunks_finds_the_longest(states: StateCache) -> None:
    states.put([*SYSTEM[:8], 1, 2, 3, 4, 5], [b"short"])
    states.put([*SYSTEM, 7, 7, 7], [b"long"])
    hit = states.get([*SYSTEM, 9, 9, 9, 9, 9])  # shares 18 tokens with "long", 8 with "short"
    assert payload_of(hit) == b"long" and hit is not None and hit.num_shared == 18
    assert payload_of(states.get(SYSTEM[:9] + [0] * 8)) in (b"long", b"short")
    assert states.get(SYSTEM[:3] + [0] * 8) is None  # no full chunk in common
    assert states.get([5] * 20) is None


def test_a_state_shorter_than_a_chunk_is_found_by_its_exact_tokens(states: StateCache) -> None:
    states.put([1, 2, 3], [b"tiny"])
    assert payload_of(states.get([1, 2, 3])) == b"tiny"
    assert states.get([1, 2, 3, 4, 5]) is None


def test_lookup_probes_at_most_one_marker_per_chunk(
    states: StateCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(50):  # many states that share nothing with the query
        states.put([i, *SYSTEM], [b"x"])
    asked: list[str] = []
    get = states.pool.get
    monkeypatch.setattr(states.pool, "get", lambda key, *a: asked.append(key) or get(key, *a))
    query = [999] * 40
    assert states.get(query) is None
    assert len(asked) == 1 + len(query) // CHUNK  # the exact record, then each chunk's marker


def test_settings_model_and_salt_separate_states(pool: kvcache.Pool, states: StateCache) -> None:
    states.put(SYSTEM, [b"a"])
    for other in (
        StateCache(
            pool, "model-a", StateLayout.of("engine", n_ctx=1024, type_k=1), chunk_tokens=CHUNK
        ),
        StateCache(pool, "model-b", LAYOUT, chunk_tokens=CHUNK),
        StateCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK, salt="tenant-2"),
        StateCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK * 2),
    ):
        assert other.get(SYSTEM) is None


def test_state_and_chunk_namespaces_never_share_keys() -> None:
    chunks = Namespace("model-a", KVLayout(2, 2, 8, "float32"), CHUNK)
    state = Namespace("model-a", LAYOUT, CHUNK)
    assert chunks.digest != state.digest
    assert chunk_keys(state, as_tokens(SYSTEM))[0].startswith(STATE_KEY_PREFIX)
    assert not set(chunk_keys(chunks, as_tokens(SYSTEM))) & set(
        chunk_keys(state, as_tokens(SYSTEM))
    )


def damage(pool: kvcache.Pool, key: str, at: int) -> None:
    value = bytearray(pool[key])  # type: ignore[arg-type]
    value[at] ^= 0x40
    pool.put(key, bytes(value))


@pytest.mark.parametrize("at", [0, 8, 30, 50, 60, 64, -1])
def test_a_damaged_record_is_a_miss(pool: kvcache.Pool, states: StateCache, at: int) -> None:
    key = states.put(SYSTEM, [b"payload"])
    damage(pool, key, at)
    assert states.get(SYSTEM) is None
    assert states.get([*SYSTEM, 1, 2]) is None


def test_a_truncated_or_foreign_record_is_a_miss(pool: kvcache.Pool, states: StateCache) -> None:
    key = states.put(SYSTEM, [b"payload"])
    value = pool[key]
    for bad in (value[:-1], value + b"x", value[:10], b"", np.zeros(100, np.uint8)):
        pool.put(key, bad)
        assert states.get(SYSTEM) is None


@pytest.mark.parametrize("at", [0, 8, 16, 30, 63])
def test_a_damaged_marker_is_a_miss(pool: kvcache.Pool, states: StateCache, at: int) -> None:
    states.put(SYSTEM, [b"payload"])
    markers = [k for k in pool if k.startswith(STATE_KEY_PREFIX) and ":t" not in k]  # type: ignore[union-attr]
    assert len(markers) == len(SYSTEM) // CHUNK
    for marker in markers:
        damage(pool, marker, at)  # type: ignore[arg-type]
    assert states.get([*SYSTEM, 1, 2]) is None
    assert payload_of(states.get(SYSTEM)) == b"payload"  # the exact record needs no marker


def test_a_marker_pointing_at_another_prompt_is_a_miss(
    pool: kvcache.Pool, states: StateCache
) -> None:
    """A marker copied under another prompt's key names a record whose tokens differ."""
    states.put(SYSTEM, [b"a"])
    other = [1] * 18
    states.put(other, [b"b"])
    ours = chunk_keys(states.namespace, as_tokens(SYSTEM))
    theirs = chunk_keys(states.namespace, as_tokens(other))
    for mine, foreign in zip(ours, theirs, strict=True):
        pool.put(mine, pool[foreign])
    assert states.get([*SYSTEM, 5, 5]) is None


def test_bad_arguments(pool: kvcache.Pool) -> None:
    with pytest.raises(InvalidArgument, match="pool must be"):
        StateCache("pool", "m", LAYOUT)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="StateLayout"):
        StateCache(pool, "m", KVLayout(2, 2, 8))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="sorted"):
        StateLayout("e", (("b", "1"), ("a", "2")))
    with pytest.raises(InvalidArgument, match="integers"):
        StateCache(pool, "m", LAYOUT).get(["a", "b"])


def test_markers_chain_as_parents_under_the_prefix_policy(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    pool = make_pool("4M", page_size="4K", policy="prefix")
    states = StateCache(pool, "model-a", LAYOUT, chunk_tokens=CHUNK)
    states.put(SYSTEM, [b"a"])
    assert len(pool) == 1 + len(SYSTEM) // CHUNK
    assert payload_of(states.get([*SYSTEM[:12], 0, 0])) == b"a"


def test_get_and_put_feed_the_models_token_counters(pool: kvcache.Pool, states: StateCache) -> None:
    states.put(SYSTEM, [b"state"])  # 18 tokens stored
    assert states.get([*SYSTEM, 1, 2]) is not None  # 20 queried, 18 shared
    assert states.get([5] * 8) is None  # 8 queried, none hit
    assert states.get(SYSTEM, count=False) is not None  # a presence check counts nothing
    counts = pool.metrics().tokens["model-a"]
    assert (counts.queried, counts.hit, counts.stored) == (28, 18, 18)
