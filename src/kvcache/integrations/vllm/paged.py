"""KV between vLLM's paged blocks and the pool's token-major chunks, per attention backend.

vLLM hands each attention layer's cache to the connector as one tensor,
``[num_blocks, kv_heads, block_size, 2 * head_dim]`` (logically), but the
backends disagree on what the last two dimensions hold::

    CPU backend (ROWS)              one block, one head: block_size x 2*head_dim elements,
    +------------------------+      read as 2*block_size rows of head_dim:
    | K row of token 0       |      all keys first, then all values
    | ...                    |
    | K row of token bs-1    |
    | V row of token 0       |
    | ...                    |
    +------------------------+

    CUDA flash attention (HALVES)   one token, one head: [ K (head_dim) | V (head_dim) ],
                                    and the tensor's strides may put tokens outside heads

Both are turned into one view of shape ``(blocks, 2, kv_heads, block_size,
head_dim)`` (:func:`split_view`, no copy), so a load or a save is one indexed
copy per layer between that view and the pool's (tokens, layers, 2, kv_heads,
head_dim) host buffer. The host buffer comes from ``devices.host_buffer``:
pinned on a GPU, so each layer crosses the bus in one DMA; on the CPU it is
plain memory and the copy is the only one.
"""

from __future__ import annotations

import enum

import torch

from ...errors import InvalidArgument


class PagedLayout(enum.Enum):
    """Where keys and values sit inside one block of a backend's per-layer cache."""

    ROWS = "rows"
    """Keys of all the block's tokens, then their values (vLLM's CPU backend)."""
    HALVES = "halves"
    """Each token's keys, then its values, along the last dimension (flash attention)."""


def split_view(kv_layer: torch.Tensor, layout: PagedLayout, head_dim: int) -> torch.Tensor:
    """``kv_layer`` viewed as ``(blocks, 2, kv_heads, block_size, head_dim)``, sharing memory.

    Raises:
        InvalidArgument: a tensor that is not ``[blocks, heads, block_size, 2 * head_dim]``,
            or (ROWS) whose blocks are not contiguous.
    """
    if kv_layer.ndim != 4 or kv_layer.shape[3] != 2 * head_dim:
        raise InvalidArgument(
            f"vLLM's KV cache layer has shape {tuple(kv_layer.shape)}, not "
            f"[blocks, kv_heads, block_size, 2 * head_dim={2 * head_dim}]: "
            "this attention backend's layout is not supported"
        )
    blocks, heads, block_size, _ = kv_layer.shape
    if layout is PagedLayout.ROWS:
        # view() itself refuses strides that do not allow it
        rows = kv_layer.view(blocks, heads, 2, block_size, head_dim)
        return rows.permute(0, 2, 1, 3, 4)
    return kv_layer.unflatten(3, (2, head_dim)).permute(0, 3, 1, 2, 4)


def kernel_block_ids(block_ids: list[int], ratio: int) -> list[int]:
    """The ids of the backend's blocks that make up the scheduler's ``block_ids``.

    A backend may page in smaller blocks than the scheduler (its kernel block
    size); scheduler block b is then kernel blocks ``b * ratio ... b * ratio + ratio - 1``.
    """
    if ratio == 1:
        return block_ids
    return [block * ratio + part for block in block_ids for part in range(ratio)]


def scatter(
    host: torch.Tensor, layers: list[torch.Tensor], block_ids: list[int], device: torch.device
) -> None:
    """Write token-major KV into the blocks ``block_ids`` of every layer.

    Args:
        host: (tokens, layers, 2, kv_heads, head_dim) on the host; tokens is
            ``len(block_ids)`` whole blocks.
        layers: each layer's :func:`split_view`, in the order of ``host``'s layers.
        block_ids: the blocks (of the views' block size) the tokens go to, in order.
        device: where the layers live; the KV crosses to it in one copy.
    """
    source = host.to(device, non_blocking=False)  # the host buffer is reused right after
    index = torch.tensor(block_ids, device=device)
    for layer, view in enumerate(layers):
        _, _, heads, block_size, head_dim = view.shape
        tokens = source[:, layer].view(len(block_ids), block_size, 2, heads, head_dim)
        tokens = tokens.permute(0, 2, 3, 1, 4)  # as the view: (blocks, 2, heads, block, dim)
        order = _memory_order(view)
        if order is None:
            view[index] = tokens
        else:
            # Indexed assignment through the permuted view costs 3.4x more on the CPU
            # (2048 tokens x 8 layers: 35 ms) than one permuting copy into the blocks'
            # memory order followed by a block-wise index_copy_ (10.5 ms).
            memory = view.permute(order)
            memory.index_copy_(0, index, tokens.permute(order).contiguous())


def gather(host: torch.Tensor, layers: list[torch.Tensor], block_ids: list[int]) -> None:
    """Copy the KV of the blocks ``block_ids`` of every layer into token-major ``host``.

    Args:
        host: (tokens, layers, 2, kv_heads, head_dim) on the host, tokens being
            ``len(block_ids)`` whole blocks; pinned when the layers are on a GPU.
        layers: each layer's :func:`split_view`.
        block_ids: the blocks to read, in token order.
    """
    if not layers:
        return
    index = torch.tensor(block_ids, device=layers[0].device)
    for layer, view in enumerate(layers):
        picked = view[index]  # (blocks, 2, heads, block_size, dim): one gather per layer
        host[:, layer].copy_(picked.permute(0, 3, 1, 2, 4).flatten(0, 1))


def _memory_order(view: torch.Tensor) -> tuple[int, ...] | None:
    """The order of ``view``'s dimensions in memory, outermost first, if that order is
    contiguous with the blocks outermost; otherwise None."""
    order = tuple(sorted(range(view.ndim), key=view.stride, reverse=True))
    contiguous = order[0] == 0 and view.permute(order).is_contiguous()
    return order if contiguous else None
