"""Chunk keys: chained over the whole prefix, namespaced, the same in every process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from kvcache import InvalidArgument, KVLayout
from kvcache.prefix import Namespace
from kvcache.prefix.keys import KEY_PREFIX, as_tokens, chunk_keys

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32")
NS = Namespace("model-a", LAYOUT, chunk_tokens=4)
TOKENS = np.arange(100, 118)  # 4 full chunks of 4 and 2 tokens over


def keys_of(tokens: object, namespace: Namespace = NS) -> list[str]:
    return chunk_keys(namespace, as_tokens(tokens))


def test_only_full_chunks_get_keys() -> None:
    assert len(keys_of(TOKENS)) == 4
    assert len(keys_of(TOKENS[:3])) == 0
    assert keys_of(TOKENS[:8]) == keys_of(TOKENS)[:2]
    assert all(key.startswith(KEY_PREFIX) for key in keys_of(TOKENS))


def test_a_key_names_its_whole_prefix() -> None:
    base = keys_of(TOKENS)
    changed_first = TOKENS.copy()
    changed_first[0] += 1
    assert not set(keys_of(changed_first)) & set(base)  # every later chunk differs too
    changed_third = TOKENS.copy()
    changed_third[9] += 1  # in chunk 2
    keys = keys_of(changed_third)
    assert keys[:2] == base[:2]
    assert keys[2] != base[2] and keys[3] != base[3]


def test_the_same_chunk_after_different_chunks_has_different_keys() -> None:
    a = np.r_[[1, 2, 3, 4], [9, 9, 9, 9]]
    b = np.r_[[5, 6, 7, 8], [9, 9, 9, 9]]
    assert keys_of(a)[1] != keys_of(b)[1]


def test_token_containers_and_int_widths_give_the_same_keys() -> None:
    expected = keys_of(TOKENS.astype(np.int64))
    for tokens in (
        TOKENS.tolist(),
        TOKENS.astype(np.int32),
        TOKENS.astype(np.uint16),
        TOKENS[None],
    ):
        assert keys_of(tokens) == expected


def test_keys_are_stable_across_processes_and_releases() -> None:
    """Golden value: a change here orphans every chunk stored by earlier releases."""
    script = (
        "import numpy as np; from kvcache import KVLayout; from kvcache.prefix import Namespace;"
        "from kvcache.prefix.keys import chunk_keys, as_tokens;"
        "ns = Namespace('model-a', KVLayout(2, 2, 8, 'float32'), 4);"
        "print(chunk_keys(ns, as_tokens(np.arange(100, 118)))[3])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {keys_of(TOKENS)[3]}
    assert keys_of(TOKENS)[3] == (
        "kvprefix:572f447aad56:3:511623bd774c4569bc2175003205d33e0cc64f431218a7803597f9108f4ab14b"
    )


@pytest.mark.parametrize(
    "other",
    [
        dataclasses.replace(NS, model="model-b"),
        dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, num_layers=3)),
        dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, num_kv_heads=1)),
        dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, head_dim=16)),
        dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, dtype="bfloat16")),
        dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, dtype="float16")),
        dataclasses.replace(NS, salt="tenant-1"),
        dataclasses.replace(NS, salt=b"tenant-1\x00"),
    ],
    ids=["model", "layers", "kv_heads", "head_dim", "bfloat16", "float16", "salt", "salt-bytes"],
)
def test_namespaces_share_no_keys(other: Namespace) -> None:
    assert other.digest != NS.digest
    assert not set(keys_of(TOKENS, other)) & set(keys_of(TOKENS, NS))


def test_fields_cannot_run_into_each_other() -> None:
    # length-prefixed fields: moving a byte from the model id to the salt changes the digest
    a = Namespace("model-a", LAYOUT, 4, salt="x")
    b = Namespace("model-ax", LAYOUT, 4, salt="")
    assert a.digest != b.digest
    assert Namespace("m", LAYOUT, 4, salt=None).digest == Namespace("m", LAYOUT, 4, salt="").digest


def test_chunk_size_is_part_of_the_namespace() -> None:
    assert Namespace("model-a", LAYOUT, 8).digest != NS.digest


def test_max_chunks() -> None:
    assert chunk_keys(NS, as_tokens(TOKENS), max_chunks=2) == keys_of(TOKENS)[:2]
    assert chunk_keys(NS, as_tokens(TOKENS), max_chunks=0) == []


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (np.zeros((2, 8), np.int64), "one sequence"),
        (np.zeros(8, np.float32), "integers"),
        (["a", "b"], "integers"),
        (object(), "numpy array"),
    ],
)
def test_bad_token_ids(tokens: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        as_tokens(tokens)


def test_empty_prompt_has_no_keys() -> None:
    assert keys_of([]) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "model"),
        ({"chunk_tokens": 0}, "chunk_tokens"),
        ({"chunk_tokens": True}, "chunk_tokens"),
        ({"salt": 5}, "salt"),
        ({"layout": (2, 2, 8)}, "KVLayout"),
    ],
)
def test_bad_namespaces(kwargs: dict[str, object], message: str) -> None:
    fields = {"model": "m", "layout": LAYOUT, "chunk_tokens": 4, **kwargs}
    with pytest.raises(InvalidArgument, match=message):
        Namespace(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"num_layers": 0}, {"num_kv_heads": -1}, {"head_dim": 2.0}, {"dtype": "int8"}],
)
def test_bad_layouts(kwargs: dict[str, object]) -> None:
    fields = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8, "dtype": "float32", **kwargs}
    with pytest.raises(InvalidArgument):
        KVLayout(**fields)  # type: ignore[arg-type]


def test_layout_sizes() -> None:
    layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")
    assert layout.token_shape == (32, 2, 8, 128)
    assert layout.token_bytes == 32 * 2 * 8 * 128 * 2
    assert layout.storage_dtype == np.dtype("<u2")


def test_chunk_keys_are_the_ones_pools_and_snapshots_already_hold() -> None:
    """Whole-state namespaces were added beside the chunk ones without changing a chunk key
    (this key was computed by the code before them)."""
    ns = Namespace("model-a", KVLayout(2, 2, 8, "float32"), 4, salt="t")
    assert ns.digest.hex().startswith("ef3f38dbf0514d4a916543f1be5910d0")
    assert keys_of(np.arange(100, 118), ns)[-1] == (
        "kvprefix:ef3f38dbf051:3:9adb564a005016aa5afb5f32a2d3c359bc91646eb87947716a8987a1204d0abb"
    )
