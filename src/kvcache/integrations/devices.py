"""KV between the pool (host memory) and a model's device: one transfer each way.

A prefix is retrieved into host memory, token-major (see ``prefix.tensors``).
For a model on a GPU that array goes to the device whole, in one copy, and the
layers' keys and values are strided views of it there: one host -> device
transfer per load, not one per layer or per chunk. Saving stacks the layers
on the device (device memory is ~100x faster than the link) and brings back,
in one transfer, only the tokens after the chunks the pool already has.

CUDA copies run at full speed only from page-locked ("pinned") host memory;
from ordinary memory the driver first copies through a pinned bounce buffer
of its own. Pinning memory is slow (a system call that locks every page), so
each thread keeps one pinned buffer and grows it as prompts grow: reused, it
costs nothing per load. Other devices (``meta``, ``mps``, ``xpu``) get a plain
``.to(device)`` of the same contiguous array.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import InvalidArgument
from ..prefix import PrefixCache
from ..prefix.keys import as_tokens
from ..prefix.tensors import TRAILER_BYTES

_MIN_PINNED_BYTES = 1 << 20


class _Pinned(threading.local):
    """This thread's pinned host buffer (a uint8 tensor), grown to the largest request."""

    buffer: torch.Tensor | None = None

    def take(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            size = max(_MIN_PINNED_BYTES, 1 << (nbytes - 1).bit_length())
            self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return self.buffer[:nbytes]


_pinned = _Pinned()


def host_buffer(pc: PrefixCache, num_tokens: int, device: torch.device) -> torch.Tensor:
    """A token-major (tokens, layers, 2, heads, dim) host tensor to retrieve ``num_tokens`` into.

    Pinned when ``device`` is a GPU, and a little longer than asked (the trailer
    of the last chunk lands after it, sparing ``retrieve`` a bounce copy).
    """
    layout = pc.layout
    spare_tokens = -(-TRAILER_BYTES // layout.token_bytes)
    nbytes = (num_tokens + spare_tokens) * layout.token_bytes
    flat = _pinned.take(nbytes) if device.type == "cuda" else torch.empty(nbytes, dtype=torch.uint8)
    dtype = getattr(torch, layout.dtype)
    return flat.view(dtype).view(num_tokens + spare_tokens, *layout.token_shape)


def load_to(pc: PrefixCache, token_ids: Any, limit: int, device: torch.device) -> torch.Tensor:
    """The cached KV of at most ``limit`` leading tokens of ``token_ids``, on ``device``.

    Returns:
        A (layers, 2, kv_heads, n, head_dim) tensor on ``device`` (a view of a
        token-major one), n a multiple of chunk_tokens or ``limit``.
    """
    tokens = as_tokens(token_ids)
    host = host_buffer(pc, len(tokens), device)
    _, hit = pc.retrieve(tokens, out=host)
    moved = host[: min(hit, limit)].to(device)  # one contiguous copy (blocking: host is reused)
    return moved.permute(1, 2, 3, 0, 4)


def save_from(
    pc: PrefixCache,
    token_ids: Any,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    **put_options: Any,
) -> int:
    """Store the full chunks of ``token_ids`` from per-layer KV on a device other than the CPU.

    Only the tokens after the leading chunks the pool holds leave the device.

    Raises:
        InvalidArgument: KV on the ``meta`` device (it holds no values).
    """
    device = pairs[0][0].device
    if device.type == "meta":
        raise InvalidArgument("the cache is on the meta device: it holds no values to save")
    tokens = as_tokens(token_ids)
    full = len(tokens) // pc.chunk_tokens * pc.chunk_tokens
    first = min(pc.lookup(tokens[:full]), full)
    if first == full:
        return 0
    lacking = [(_unbatched(k)[:, first:full], _unbatched(v)[:, first:full]) for k, v in pairs]
    stacked = torch.stack([torch.stack(pair) for pair in lacking])

    def fill(host: torch.Tensor) -> None:
        host.copy_(stacked.permute(3, 0, 1, 2, 4))  # contiguous on the device, one transfer back

    return store_through_host(pc, tokens[:full], first, device, fill, **put_options)


def store_through_host(
    pc: PrefixCache,
    token_ids: Any,
    first_token: int,
    device: torch.device,
    fill: Callable[[torch.Tensor], None],
    **put_options: Any,
) -> int:
    """Store the chunks of ``token_ids`` from ``first_token`` on, through one host buffer.

    Args:
        pc: the cache to store in.
        token_ids: the prompt up to the last token stored (whole chunks).
        first_token: where the stored KV starts (the chunks before it are in the pool).
        device: where the KV comes from (a GPU's gets a pinned buffer).
        fill: writes the KV of tokens ``first_token ..`` into the buffer it is
            given, token-major: (tokens, layers, 2, kv_heads, head_dim).
        **put_options: ``PrefixCache.store``'s ``priority`` and ``ttl``.

    Returns:
        The tokens written (``PrefixCache.store``).
    """
    num_tokens = len(token_ids) - first_token
    host = host_buffer(pc, num_tokens, device)[:num_tokens]
    fill(host)
    return pc.store(token_ids, host.permute(1, 2, 3, 0, 4), first_token=first_token, **put_options)


def _unbatched(tensor: torch.Tensor) -> torch.Tensor:
    """(1, heads, tokens, dim) or (heads, tokens, dim) as the latter."""
    return tensor[0] if tensor.ndim == 4 else tensor
