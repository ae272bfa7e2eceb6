"""config: PoolConfig validation, defaults and rounding."""

from __future__ import annotations

import dataclasses

import pytest

from kvcache import InvalidArgument, PoolConfig
from kvcache.config import (
    DEFAULT_EVICTION_SAMPLES,
    DEFAULT_MAX_PROCESSES,
    DEFAULT_PAGE_SIZE_BYTES,
    MAX_PAGE_SIZE_BYTES,
    MIN_PAGE_SIZE_BYTES,
)
from kvcache.policies import POLICIES

K, M, G = 1 << 10, 1 << 20, 1 << 30


def test_defaults() -> None:
    config = PoolConfig.build("1G")
    assert config.size_bytes == G
    assert config.page_size_bytes == DEFAULT_PAGE_SIZE_BYTES == 64 * K
    assert config.policy == "lru"
    assert config.num_pages == G // (64 * K)
    assert config.max_entries == config.num_pages  # one per page
    assert config.lfu_half_life == config.max_entries
    assert config.default_ttl_s is None
    assert config.eviction_samples == DEFAULT_EVICTION_SAMPLES
    assert config.max_processes == DEFAULT_MAX_PROCESSES


def test_lfu_half_life_defaults_to_max_entries_when_given() -> None:
    config = PoolConfig.build("1M", page_size="1K", max_entries=10)
    assert config.max_entries == 10
    assert config.lfu_half_life == 10
    assert PoolConfig.build("1M", lfu_half_life=7).lfu_half_life == 7


def test_dataclass_defaults_match_build() -> None:
    assert PoolConfig(size_bytes=G) == PoolConfig.build(G)


def test_size_is_rounded_down_to_whole_pages() -> None:
    config = PoolConfig.build(10 * K + 1000, page_size="1K")
    assert config.size_bytes == 10 * K
    assert config.num_pages == 10
    config = PoolConfig(size_bytes=3 * 64 * K - 1)
    assert config.size_bytes == 2 * 64 * K
    assert config.max_entries == 2


def test_size_of_exactly_one_page() -> None:
    config = PoolConfig.build("64K")
    assert config.num_pages == 1 and config.max_entries == 1


@pytest.mark.parametrize(
    "page_size",
    [3000, 1000, 512, MIN_PAGE_SIZE_BYTES // 2, MAX_PAGE_SIZE_BYTES * 2, 1, 3 * K],
)
def test_page_size_must_be_a_power_of_two_in_range(page_size: int) -> None:
    with pytest.raises(InvalidArgument, match="power of two"):
        PoolConfig.build("1G", page_size=page_size)


@pytest.mark.parametrize("page_size", [MIN_PAGE_SIZE_BYTES, 4 * K, 2 * M, MAX_PAGE_SIZE_BYTES])
def test_page_size_bounds_are_inclusive(page_size: int) -> None:
    assert PoolConfig.build("1G", page_size=page_size).page_size_bytes == page_size


@pytest.mark.parametrize("page_size", ["0", "-64K", "", "huge"])
def test_page_size_text_is_validated(page_size: str) -> None:
    with pytest.raises(InvalidArgument):
        PoolConfig.build("1G", page_size=page_size)


def test_size_smaller_than_a_page() -> None:
    with pytest.raises(InvalidArgument, match="smaller than one page"):
        PoolConfig.build("32K", page_size="64K")
    with pytest.raises(InvalidArgument, match="smaller than one page"):
        PoolConfig(size_bytes=0)


@pytest.mark.parametrize("size", ["", "0", "-1G", "lots", None, True])
def test_bad_size(size: object) -> None:
    with pytest.raises(InvalidArgument, match="pool size"):
        PoolConfig.build(size)  # type: ignore[arg-type]


def test_unknown_policy_lists_the_valid_names() -> None:
    with pytest.raises(InvalidArgument) as info:
        PoolConfig.build("1M", policy="mru")
    assert isinstance(info.value, ValueError)
    for name in POLICIES:
        assert name in str(info.value)
    assert set(POLICIES) == {
        "lru",
        "lfu",
        "fifo",
        "priority",
        "ttl",
        "size",
        "s3fifo",
        "arc",
        "prefix",
    }


@pytest.mark.parametrize("policy", [None, 3, b"lru"])
def test_policy_must_be_text(policy: object) -> None:
    with pytest.raises(InvalidArgument):
        PoolConfig.build("1M", policy=policy)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_is_accepted_in_any_case(policy: str) -> None:
    assert PoolConfig.build("1M", policy=policy.upper()).policy == policy


def test_unknown_policy_in_the_dataclass() -> None:
    with pytest.raises(InvalidArgument, match="lru"):
        PoolConfig(size_bytes=M, policy="LRU")  # the dataclass takes exact names


@pytest.mark.parametrize("max_entries", [0, -1, 2**31, True, 1.5, "10"])
def test_max_entries_bounds(max_entries: object) -> None:
    with pytest.raises(InvalidArgument):
        PoolConfig.build("1M", max_entries=max_entries)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_entries", [-1, 2**31])
def test_max_entries_bounds_in_the_dataclass(max_entries: int) -> None:
    with pytest.raises(InvalidArgument, match="max entries"):
        PoolConfig(size_bytes=M, max_entries=max_entries)


def test_max_entries_accepted_range() -> None:
    assert PoolConfig.build("1M", max_entries=1).max_entries == 1
    assert PoolConfig.build("1M", max_entries=16).max_entries == 16  # one per page


def test_max_entries_may_not_exceed_pages() -> None:
    """Every entry takes at least one page, so more slots than pages is a mistake."""
    with pytest.raises(InvalidArgument, match="16 pages"):
        PoolConfig.build("1M", max_entries=17)
    with pytest.raises(InvalidArgument, match="max entries"):
        PoolConfig(size_bytes=M, page_size_bytes=K, max_entries=1025)


@pytest.mark.parametrize("ttl", ["1h", 90, "90s", 0.5])
def test_default_ttl(ttl: object) -> None:
    config = PoolConfig.build("1M", default_ttl=ttl)  # type: ignore[arg-type]
    assert config.default_ttl_s is not None and config.default_ttl_s > 0
    assert PoolConfig.build("1M", default_ttl="1h").default_ttl_s == 3600.0


@pytest.mark.parametrize("ttl", ["0", 0, -5, "-1h", "forever", float("inf"), float("nan")])
def test_bad_default_ttl(ttl: object) -> None:
    with pytest.raises(InvalidArgument, match="ttl"):
        PoolConfig.build("1M", default_ttl=ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_default_ttl_in_the_dataclass(ttl: float) -> None:
    with pytest.raises(InvalidArgument, match="ttl"):
        PoolConfig(size_bytes=M, default_ttl_s=ttl)


@pytest.mark.parametrize("half_life", [-1, True, 2.5])
def test_bad_lfu_half_life(half_life: object) -> None:
    with pytest.raises(InvalidArgument, match="half-life"):
        PoolConfig.build("1M", lfu_half_life=half_life)  # type: ignore[arg-type]


@pytest.mark.parametrize("samples", [0, -1, (1 << 16) + 1])
def test_bad_eviction_samples(samples: int) -> None:
    with pytest.raises(InvalidArgument, match="eviction samples"):
        PoolConfig.build("1M", eviction_samples=samples)


@pytest.mark.parametrize("procs", [0, (1 << 20) + 1])
def test_bad_max_processes(procs: int) -> None:
    with pytest.raises(InvalidArgument, match="max processes"):
        PoolConfig.build("1M", max_processes=procs)


def test_config_is_frozen_and_serialisable() -> None:
    config = PoolConfig.build("1M", page_size="4K", policy="lfu", default_ttl="1m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.size_bytes = 1  # type: ignore[misc]
    assert config.to_dict() == {
        "size_bytes": M,
        "page_size_bytes": 4 * K,
        "policy": "lfu",
        "max_entries": 256,
        "default_ttl_s": 60.0,
        "eviction_samples": DEFAULT_EVICTION_SAMPLES,
        "lfu_half_life": 256,
        "max_processes": DEFAULT_MAX_PROCESSES,
        "inline_bytes": 0,
    }
