"""Fixtures of the integration tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

import kvcache


@pytest.fixture
def inference() -> Iterator[None]:
    """Run the test as inference runs, without autograd (for modules that import torch)."""
    with sys.modules["torch"].inference_mode():
        yield


@pytest.fixture
def pool(make_pool: Callable[..., kvcache.Pool]) -> kvcache.Pool:
    return make_pool("16M", page_size="4K")
