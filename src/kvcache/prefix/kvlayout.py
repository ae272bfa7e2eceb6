"""The shape of a model's KV cache: layers, KV heads, head size and element type.

One token's keys and values, over all layers, are ``num_layers x 2 x
num_kv_heads x head_dim`` elements of ``dtype``. The prefix cache stores them
token-major (see ``tensors``); this module only describes and validates them.

Element types are named as torch names them. numpy has no bfloat16, so a
bfloat16 tensor travels as its raw 16-bit patterns in a ``uint16`` array: the
bits are what matter, and torch reinterprets them without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import InvalidArgument
from ..units import whole_number


class DType(NamedTuple):
    """An element type the prefix cache stores."""

    tag: int
    """Its number in chunk trailers; never reuse one."""
    storage: np.dtype
    """The numpy dtype its bytes are handled as (raw bits for bfloat16)."""


DTYPES: dict[str, DType] = {
    "float32": DType(1, np.dtype("<f4")),
    "float16": DType(2, np.dtype("<f2")),
    "bfloat16": DType(3, np.dtype("<u2")),
}
"""Element types by name; ``storage`` is what arrays of that type are in numpy."""

_MAX_DIM = 1 << 20
"""A bound on layers, heads and head size that no real model approaches, so
that a typo (or a token count passed as a head count) fails early."""


@dataclass(frozen=True)
class KVLayout:
    """The KV-cache shape of one model: what a chunk of cached tokens holds.

    Attributes:
        num_layers: decoder layers that keep a KV cache.
        num_kv_heads: key/value heads per layer (fewer than attention heads with GQA).
        head_dim: elements per head.
        dtype: ``float32``, ``float16`` or ``bfloat16``.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            whole_number(getattr(self, name), name, low=1, high=_MAX_DIM)
        if self.dtype not in DTYPES:
            raise InvalidArgument(
                f"dtype {self.dtype!r} is not supported: use one of {', '.join(DTYPES)}"
            )

    @property
    def storage_dtype(self) -> np.dtype:
        """The numpy dtype of this layout's arrays (``uint16`` bit patterns for bfloat16)."""
        return DTYPES[self.dtype].storage

    @property
    def token_shape(self) -> tuple[int, int, int, int]:
        """One token's KV: (num_layers, 2, num_kv_heads, head_dim)."""
        return (self.num_layers, 2, self.num_kv_heads, self.head_dim)

    @property
    def token_bytes(self) -> int:
        """Bytes of KV per token, all layers, keys and values."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.storage_dtype.itemsize
