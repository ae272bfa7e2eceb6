"""Chunk keys: a namespace digest, and BLAKE2b hashes chained over token chunks.

A prompt is cut into chunks of ``chunk_tokens`` tokens; only full chunks get
keys. Chunk i's key names the whole prefix that ends with it::

    ns      = BLAKE2b-256(FORMAT, model, layout, dtype, chunk_tokens, salt)
    link[0] = BLAKE2b-256(ns        || tokens[0 : C])
    link[i] = BLAKE2b-256(link[i-1] || tokens[i*C : (i+1)*C])
    key[i]  = "kvprefix:" + hex(ns)[:12] + ":" + i + ":" + hex(link[i])

so equal keys mean equal namespaces and equal tokens from the very first one,
and a chunk is never reused after a different earlier chunk. Token ids are
hashed as little-endian int64, so lists, int32 and int64 arrays give the same
keys. The namespace's fields are length-prefixed before hashing, so no two
different namespaces encode to the same bytes.

Why BLAKE2b and not Python's ``hash()``: ``hash()`` of bytes is salted per
process (PYTHONHASHSEED), so two processes would never agree on a key; and a
256-bit cryptographic digest makes it infeasible to craft tokens whose chunk
collides with another tenant's, which would hand over that tenant's KV. It
costs about 2 us per 256-token chunk. The short namespace and the chunk index
in the key only make pool listings readable; the link alone decides.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgument
from ..units import whole_number
from .arrays import numpy_view
from .kvlayout import KVLayout

FORMAT = b"kvcache.prefix/1"
"""Hashed into every namespace: bump it when the stored KV format changes, so
that chunks of the old format are never read as the new one."""
KEY_PREFIX = "kvprefix:"
DIGEST_BYTES = 32
MAX_CHUNK_TOKENS = 1 << 20


def _field(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


@dataclass(frozen=True)
class Namespace:
    """What a cached chunk belongs to: model, KV layout, chunk size and tenant.

    Two namespaces share no keys unless every field is equal.

    Attributes:
        model: the model's id (``"llama-3-8b-instruct"``); include its revision
            if weights change under the same name.
        layout: the model's KV layout, element type included.
        chunk_tokens: tokens per chunk.
        salt: a tenant or any other separator (``str`` or ``bytes``); None for none.
        digest: BLAKE2b-256 of all of the above (derived).
    """

    model: str
    layout: KVLayout
    chunk_tokens: int
    salt: str | bytes | None = None
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidArgument(f"model must be a non-empty model id string, not {self.model!r}")
        if not isinstance(self.layout, KVLayout):
            raise InvalidArgument(
                f"layout must be a kvcache.prefix.KVLayout, not {type(self.layout).__name__}"
            )
        chunk = whole_number(self.chunk_tokens, "chunk_tokens", low=1, high=MAX_CHUNK_TOKENS)
        if self.salt is not None and not isinstance(self.salt, (str, bytes)):
            raise InvalidArgument(
                f"salt must be str, bytes or None, not {type(self.salt).__name__}"
            )
        salt = self.salt.encode() if isinstance(self.salt, str) else self.salt or b""
        layout = self.layout
        encoded = b"".join(
            (
                _field(FORMAT),
                _field(self.model.encode()),
                struct.pack("<4Q", layout.num_layers, layout.num_kv_heads, layout.head_dim, chunk),
                _field(layout.dtype.encode()),
                _field(salt),
            )
        )
        digest = hashlib.blake2b(encoded, digest_size=DIGEST_BYTES, person=b"kvcache.ns").digest()
        object.__setattr__(self, "digest", digest)


def as_tokens(token_ids: object) -> np.ndarray:
    """Token ids as a 1-D little-endian int64 array (a batch of one is unwrapped).

    Raises:
        InvalidArgument: not integers, or not one sequence.
    """
    array, _ = numpy_view(token_ids, "token_ids")
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise InvalidArgument(
            f"token_ids must be one sequence (shape (n,) or (1, n)), not shape {array.shape}: "
            "look up each sequence of a batch separately"
        )
    if array.size and array.dtype.kind not in "iu":
        raise InvalidArgument(f"token_ids must be integers, not {array.dtype}")
    return array.astype("<i8", copy=False)


def chunk_keys(
    namespace: Namespace, tokens: np.ndarray, max_chunks: int | None = None
) -> list[str]:
    """The pool keys of the full chunks of ``tokens`` (from :func:`as_tokens`), first to last.

    Args:
        namespace: whose keys.
        tokens: int64 token ids.
        max_chunks: stop after this many chunks.
    """
    size = namespace.chunk_tokens
    num_chunks = len(tokens) // size
    if max_chunks is not None:
        num_chunks = min(num_chunks, max_chunks)
    label = f"{KEY_PREFIX}{namespace.digest.hex()[:12]}:"
    link = namespace.digest
    keys = []
    for index in range(num_chunks):
        chunk = tokens[index * size : (index + 1) * size]
        link = hashlib.blake2b(
            link + chunk.tobytes(), digest_size=DIGEST_BYTES, person=b"kvcache.chunk"
        ).digest()
        keys.append(f"{label}{index}:{link.hex()}")
    return keys
