"""kv_connector_extra_config: checked at start, with one line that says what to do."""

from __future__ import annotations

import pytest

import kvcache
from kvcache.errors import InvalidArgument, PoolNotFoundError
from kvcache.integrations.vllm.settings import ConnectorSettings


def test_defaults() -> None:
    settings = ConnectorSettings.from_extra_config({"pool": "p"})
    assert settings == ConnectorSettings(pool="p", size=None, tier="cpu", chunk_tokens=256)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (None, 'needs "pool"'),
        ({"pool": ""}, 'needs "pool"'),
        ({"pool": "p", "chunk_size": 128}, "unknown key.*chunk_size.*takes pool, size"),
        ({"pool": "p", "chunk_tokens": 0}, "chunk_tokens"),
        ({"pool": "p", "tier": "gpu"}, '"tier" must be'),
        ({"pool": "p", "model_id": 7}, '"model_id" must be'),
    ],
)
def test_bad_settings_are_refused(extra: dict[str, object] | None, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ConnectorSettings.from_extra_config(extra)


def test_a_missing_pool_without_a_size_is_an_error(pool_name: str) -> None:
    with pytest.raises(PoolNotFoundError, match="kvcache create"):
        ConnectorSettings(pool=pool_name).open_pool()
    assert pool_name not in kvcache.list_pools()


def test_a_size_creates_a_prefix_pool_once(pool_name: str) -> None:
    settings = ConnectorSettings(pool=pool_name, size="8M")
    first, second = settings.open_pool(), settings.open_pool()  # the second one opens it
    assert first.config.policy == "prefix" and second.stats().size_bytes == 8 << 20
    first.close()
    second.close()
