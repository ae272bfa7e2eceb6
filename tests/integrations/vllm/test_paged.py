"""vLLM's paged blocks <-> token-major KV, for the CPU backend's and flash attention's
layouts, on CPU tensors (the CUDA layout's shapes and strides, without a GPU)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvcache.errors import InvalidArgument
from kvcache.integrations.vllm.paged import (
    PagedLayout,
    gather,
    kernel_block_ids,
    scatter,
    split_view,
)

BLOCKS, HEADS, BLOCK, DIM, LAYERS = 6, 2, 4, 8, 3


def _random(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))).bfloat16()


def _cpu_layer() -> torch.Tensor:
    """A layer of vLLM's CPU backend: [blocks, heads, block_size, 2 * head_dim], contiguous."""
    return _random(BLOCKS, HEADS, BLOCK, 2 * DIM)


def _flash_layer() -> torch.Tensor:
    """A layer of flash attention: the same logical shape over memory ordered
    [blocks, block_size, heads, 2 * head_dim] (vLLM's NHD strides)."""
    return _random(BLOCKS, BLOCK, HEADS, 2 * DIM).permute(0, 2, 1, 3)


def test_rows_are_what_the_cpu_backend_reads() -> None:
    layer = _cpu_layer()
    # cpu_attn.py: view [blocks, heads, 2 * block_size, dim], keys are the first half of dim 2
    keys, values = layer.view(BLOCKS, HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)
    view = split_view(layer, PagedLayout.ROWS, DIM)
    assert view.shape == (BLOCKS, 2, HEADS, BLOCK, DIM)
    assert torch.equal(view[:, 0], keys) and torch.equal(view[:, 1], values)
    assert view.data_ptr() == layer.data_ptr()  # a view, not a copy


def test_halves_are_what_flash_attention_reads() -> None:
    layer = _flash_layer()
    assert not layer.is_contiguous()
    # flash_attn.py: (B, H, N, 2D) -> ((B, N, H, D), (B, N, H, D))
    keys, values = layer.transpose(1, 2).split(DIM, dim=-1)
    view = split_view(layer, PagedLayout.HALVES, DIM)
    assert view.shape == (BLOCKS, 2, HEADS, BLOCK, DIM)
    assert torch.equal(view[:, 0], keys.transpose(1, 2))
    assert torch.equal(view[:, 1], values.transpose(1, 2))


def _heads_outermost_layer() -> torch.Tensor:
    """Flash attention's halves over memory ordered [heads, blocks, block_size, 2 * head_dim]:
    blocks not outermost, so no block is one run of memory (the indexed-assignment path)."""
    return _random(HEADS, BLOCKS, BLOCK, 2 * DIM).permute(1, 0, 2, 3)


@pytest.mark.parametrize(
    ("layout", "make"),
    [
        (PagedLayout.ROWS, _cpu_layer),
        (PagedLayout.HALVES, _flash_layer),
        (PagedLayout.HALVES, _heads_outermost_layer),
    ],
)
def test_scatter_then_gather_round_trip(
    layout: PagedLayout, make: Callable[[], torch.Tensor]
) -> None:
    layers = [make().zero_() for _ in range(LAYERS)]
    views = [split_view(layer, layout, DIM) for layer in layers]
    blocks = [4, 1, 3]
    host = _random(len(blocks) * BLOCK, LAYERS, 2, HEADS, DIM)
    scatter(host, views, blocks, torch.device("cpu"))
    for layer, view in enumerate(views):
        for position, block in enumerate(blocks):  # token t of a block, head h: host[t, layer]
            tokens = host[position * BLOCK : (position + 1) * BLOCK, layer]
            assert torch.equal(view[block], tokens.permute(1, 2, 0, 3))
        untouched = [b for b in range(BLOCKS) if b not in blocks]
        assert not view[untouched].any()
    back = torch.empty_like(host)
    gather(back, views, blocks)
    assert torch.equal(back, host)


def test_the_wrong_layout_reads_other_values() -> None:
    """The negative control of the round trip: a layout mix-up cannot go unnoticed."""
    layers = [_cpu_layer() for _ in range(LAYERS)]
    right = torch.empty(2 * BLOCK, LAYERS, 2, HEADS, DIM, dtype=torch.bfloat16)
    wrong = torch.empty_like(right)
    gather(right, [split_view(x, PagedLayout.ROWS, DIM) for x in layers], [0, 5])
    gather(wrong, [split_view(x, PagedLayout.HALVES, DIM) for x in layers], [0, 5])
    assert not torch.equal(right, wrong)


def test_kernel_blocks_of_scheduler_blocks() -> None:
    assert kernel_block_ids([3, 0], 1) == [3, 0]
    assert kernel_block_ids([3, 0], 2) == [6, 7, 0, 1]


def test_a_layer_of_another_shape_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not supported"):
        split_view(_random(2, BLOCKS, BLOCK, HEADS, DIM), PagedLayout.HALVES, DIM)
    with pytest.raises(InvalidArgument, match="2 \\* head_dim=32"):
        split_view(_cpu_layer(), PagedLayout.ROWS, 2 * DIM)
