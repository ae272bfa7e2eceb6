"""One chunk of KV as a pool value: token-major raw bytes, then a checked trailer.

A chunk of C tokens is stored as one bytes value::

    +---------------------------------------------+----------------+
    | payload: C x layers x 2 x kv_heads x dim    | trailer        |
    | elements, C order, little-endian (tokens     | 64 bytes,      |
    | outermost; 2 = keys, values)                 | described below|
    +---------------------------------------------+----------------+

    trailer  offset  size  field
             0       4     magic b"KVPT"
             4       2     format version (1)
             6       1     dtype tag (kvlayout.DTYPES: 1 float32, 2 float16, 3 bfloat16)
             7       1     layout tag (1: token-major, as drawn above)
             8       4x4   chunk tokens, layers, kv heads, head dim
             24      4     chunk index in its prompt
             28      4     reserved (0)
             32      16    namespace digest, first 16 bytes
             48      8     payload bytes
             56      8     xxh3_64 of payload + trailer bytes 0..55

Why tokens outermost: consecutive chunks are then consecutive byte ranges of
one (tokens, layers, 2, kv_heads, dim) array, so ``retrieve`` copies each
chunk from the pool straight to its place with one ``Pool.get_into``, and
each layer's keys are a strided view of that array -- the (layers, 2, heads,
tokens, dim) order most code uses, and what a ``DynamicCache`` takes, with no
further copy. Per-layer order would put a chunk in 2 x layers x heads pieces
of the result, which needs a bounce buffer and a second copy of everything
(4-5 ms per 32 MiB here, as long as the first). Why a trailer and not a header: ``get_into`` puts a
value at the start of the space it is given, so a header would land in the
middle of the tokens; a trailer lands where the next chunk goes and is read
before that chunk overwrites it (the last chunk needs 64 bytes of slack).

Why a checksum of its own: the pool's per-entry checksum (verified on every
read unless a pool is opened with ``verify_reads=False``) says the bytes are
the ones their writer put, while this one also covers the
trailer fields a reader predicts (the chunk's position and namespace), so a
chunk damaged in memory, written by a foreign writer, or filed under the wrong
key is a miss, never wrong attention.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from ..codec import byte_view
from ..errors import InvalidArgument
from .arrays import numpy_view
from .kvlayout import DTYPES, KVLayout

TRAILER = struct.Struct("<4sHBB4II4x16sQQ")
TRAILER_BYTES = TRAILER.size
MAGIC = b"KVPT"
VERSION = 1
TOKEN_MAJOR = 1
_CHECKED_BYTES = TRAILER_BYTES - 8  # the checksum covers every trailer field before it
assert TRAILER_BYTES == 64


def chunk_view(buffer: np.ndarray, layout: KVLayout, num_tokens: int) -> np.ndarray:
    """``buffer``'s first bytes as a token-major (tokens, layers, 2, kv_heads, dim) array."""
    nbytes = num_tokens * layout.token_bytes
    return buffer[:nbytes].view(layout.storage_dtype).reshape((num_tokens, *layout.token_shape))


def trailer_head(layout: KVLayout, chunk_tokens: int, index: int, ns_digest: bytes) -> bytes:
    """Chunk ``index``'s trailer up to its checksum: everything a reader can predict."""
    packed = TRAILER.pack(
        MAGIC,
        VERSION,
        DTYPES[layout.dtype].tag,
        TOKEN_MAJOR,
        chunk_tokens,
        layout.num_layers,
        layout.num_kv_heads,
        layout.head_dim,
        index,
        ns_digest[:16],
        chunk_tokens * layout.token_bytes,
        0,
    )
    return packed[:_CHECKED_BYTES]


def checksum(payload: np.ndarray, head: bytes) -> int:
    """xxh3_64 of a chunk's payload (uint8) and its trailer head (releases the GIL)."""
    digest = xxhash.xxh3_64()
    digest.update(byte_view(payload))
    digest.update(head)
    return digest.intdigest()


def seal(buffer: np.ndarray, head: bytes) -> None:
    """Write the trailer into the last bytes of ``buffer`` (uint8), after the payload."""
    payload = buffer[:-TRAILER_BYTES]
    trailer = head + struct.pack("<Q", checksum(payload, head))
    buffer[-TRAILER_BYTES:] = np.frombuffer(trailer, np.uint8)


def recorded_checksum(trailer: np.ndarray, head: bytes) -> int | None:
    """The checksum a trailer read back records, or None if its other fields are not ``head``."""
    if len(trailer) != TRAILER_BYTES or trailer[:_CHECKED_BYTES].tobytes() != head:
        return None
    return int(struct.unpack("<Q", trailer[_CHECKED_BYTES:].tobytes())[0])


def layout_array(tensor: Any, layout: KVLayout, what: str) -> np.ndarray:
    """``tensor`` (numpy or CPU torch) as a numpy view of ``layout``'s storage dtype.

    Raises:
        InvalidArgument: its dtype is not the layout's (nothing is converted silently).
    """
    array, name = numpy_view(tensor, what)
    want = layout.dtype
    if want == "bfloat16" and name is None and array.dtype.str in ("<u2", "<i2"):
        return array.view(layout.storage_dtype)  # bit patterns, as documented
    if name != want or array.dtype.byteorder == ">":
        raise InvalidArgument(
            f"{what} is {name or array.dtype} but the cache holds little-endian {want}: convert it "
            f"(tensor.to(torch.{want}) / array.astype(...)) or use a cache of that dtype"
        )
    return array.view(layout.storage_dtype)


class KVSource:
    """The KV given to ``PrefixCache.store``, checked against a layout, copied out by token range.

    Accepts, as numpy arrays or CPU torch tensors of the layout's dtype:

    - one array of shape (layers, 2, kv_heads, tokens, head_dim), or
    - a sequence of one (keys, values) pair per layer, each of shape
      (kv_heads, tokens, head_dim) or (1, kv_heads, tokens, head_dim) -- what
      ``DynamicCache`` layers hold for a batch of one.

    numpy has no bfloat16: give bfloat16 KV as torch tensors, or as uint16/int16
    arrays of its bit patterns. ``first_token``: the prompt position of the
    array's first token (KV copied off a device only from where the pool's
    copy ends); ``num_tokens`` counts from the prompt's start.
    """

    def __init__(self, kv: Any, layout: KVLayout, first_token: int = 0) -> None:
        self.layout = layout
        self.first_token = first_token
        if isinstance(kv, (list, tuple)):
            if len(kv) != layout.num_layers:
                raise InvalidArgument(
                    f"kv has {len(kv)} layers but the cache's layout has {layout.num_layers}"
                )
            self._pairs: list[tuple[np.ndarray, np.ndarray]] | None = [
                self._layer_pair(pair, layer) for layer, pair in enumerate(kv)
            ]
            self._stacked: np.ndarray | None = None
            self.num_tokens = first_token + self._pairs[0][0].shape[1]
            if any(first_token + k.shape[1] != self.num_tokens for k, _ in self._pairs):
                raise InvalidArgument("kv layers cover different numbers of tokens")
        else:
            stacked = layout_array(kv, layout, "kv")
            expected = (layout.num_layers, 2, layout.num_kv_heads, "tokens", layout.head_dim)
            if stacked.ndim != 5 or stacked.shape[:3] + stacked.shape[4:] != (
                expected[:3] + expected[4:]
            ):
                raise InvalidArgument(
                    f"kv must have shape (layers, 2, kv_heads, tokens, head_dim) = {expected}, "
                    f"or be one (keys, values) pair per layer; got shape {stacked.shape}"
                )
            self._pairs, self._stacked = None, stacked
            self.num_tokens = first_token + stacked.shape[3]

    def copy_tokens(self, start: int, stop: int, dest: np.ndarray) -> None:
        """Copy tokens [start, stop) into ``dest``, token-major (tokens, layers, 2, heads, dim)."""
        assert start >= self.first_token, "tokens before first_token were never given"
        start, stop = start - self.first_token, stop - self.first_token
        if self._stacked is not None:
            np.copyto(dest, self._stacked[:, :, :, start:stop].transpose(3, 0, 1, 2, 4))
            return
        assert self._pairs is not None
        for layer, (keys, values) in enumerate(self._pairs):
            np.copyto(dest[:, layer, 0], keys[:, start:stop].transpose(1, 0, 2))
            np.copyto(dest[:, layer, 1], values[:, start:stop].transpose(1, 0, 2))

    def _layer_pair(self, pair: Any, layer: int) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise InvalidArgument(f"kv layer {layer} must be a (keys, values) pair")
        keys, values = (
            self._unbatched(layout_array(tensor, self.layout, f"kv layer {layer} {name}"))
            for tensor, name in zip(pair, ("keys", "values"), strict=True)
        )
        heads, dim = self.layout.num_kv_heads, self.layout.head_dim
        if keys.shape != values.shape or keys.ndim != 3 or keys.shape[::2] != (heads, dim):
            raise InvalidArgument(
                f"kv layer {layer}: keys and values must have shape (kv_heads={heads}, tokens, "
                f"head_dim={dim}), or a batch of one in front; got {keys.shape} and {values.shape}"
            )
        return keys, values

    @staticmethod
    def _unbatched(array: np.ndarray) -> np.ndarray:
        return array[0] if array.ndim == 4 and array.shape[0] == 1 else array
