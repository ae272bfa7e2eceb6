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

Whole engine states (``StateCache``, a namespace over a ``StateLayout``) use
the same chain with their own format and key prefix: a marker at chunk i is
``"kvstate:" + ns12 + ":" + i + ":" + hex(link[i])``, and a state of n tokens
is filed under ``"kvstate:" + ns12 + ":t" + n + ":" + hex(tail)``, where
``tail = BLAKE2b-256(link[last full chunk] || the tokens after it)`` (``ns``
when there is no full chunk).

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
from .statelayout import StateLayout

FORMAT = b"kvcache.prefix/1"
"""Hashed into every namespace: bump it when the stored KV format changes, so
that chunks of the old format are never read as the new one."""
STATE_FORMAT = b"kvcache.state/1"
"""The same for whole states (``StateCache``); a namespace hashes one or the other first."""
KEY_PREFIX = "kvprefix:"
STATE_KEY_PREFIX = "kvstate:"
DIGEST_BYTES = 32
MAX_CHUNK_TOKENS = 1 << 20


def _field(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


@dataclass(frozen=True)
class Namespace:
    """What a cached chunk or state belongs to: model, layout, chunk size and tenant.

    Two namespaces share no keys unless every field is equal.

    Attributes:
        model: the model's id (``"llama-3-8b-instruct"``); include its revision
            if weights change under the same name.
        layout: the model's KV layout, element type included (``PrefixCache``),
            or the engine settings whole states depend on (``StateCache``).
        chunk_tokens: tokens per chunk.
        salt: a tenant or any other separator (``str`` or ``bytes``); None for none.
        digest: BLAKE2b-256 of all of the above (derived).
    """

    model: str
    layout: KVLayout | StateLayout
    chunk_tokens: int
    salt: str | bytes | None = None
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidArgument(f"model must be a non-empty model id string, not {self.model!r}")
        if not isinstance(self.layout, (KVLayout, StateLayout)):
            raise InvalidArgument(
                "layout must be a kvcache.prefix.KVLayout or StateLayout, "
                f"not {type(self.layout).__name__}"
            )
        chunk = whole_number(self.chunk_tokens, "chunk_tokens", low=1, high=MAX_CHUNK_TOKENS)
        if self.salt is not None and not isinstance(self.salt, (str, bytes)):
            raise InvalidArgument(
                f"salt must be str, bytes or None, not {type(self.salt).__name__}"
            )
        salt = self.salt.encode() if isinstance(self.salt, str) else self.salt or b""
        layout = self.layout
        if isinstance(layout, KVLayout):  # the encoding of kvcache.prefix/1, kept byte for byte
            described = (
                _field(FORMAT),
                _field(self.model.encode()),
                struct.pack("<4Q", layout.num_layers, layout.num_kv_heads, layout.head_dim, chunk),
                _field(layout.dtype.encode()),
            )
        else:
            described = (
                _field(STATE_FORMAT),
                _field(self.model.encode()),
                struct.pack("<Q", chunk),
                _field(b"".join(_field(text.encode()) for text in layout.texts())),
            )
        encoded = b"".join((*described, _field(salt)))
        digest = hashlib.blake2b(encoded, digest_size=DIGEST_BYTES, person=b"kvcache.ns").digest()
        object.__setattr__(self, "digest", digest)

    @property
    def label(self) -> str:
        """What every key of this namespace starts with: its kind and short digest."""
        kind = KEY_PREFIX if isinstance(self.layout, KVLayout) else STATE_KEY_PREFIX
        return f"{kind}{self.digest.hex()[:12]}:"


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
    return link_keys(namespace, chunk_links(namespace, tokens, max_chunks))


def link_keys(namespace: Namespace, links: list[bytes]) -> list[str]:
    """The keys of chunks whose :func:`chunk_links` are ``links``."""
    label = namespace.label
    return [f"{label}{index}:{link.hex()}" for index, link in enumerate(links)]


def chunk_links(
    namespace: Namespace, tokens: np.ndarray, max_chunks: int | None = None
) -> list[bytes]:
    """The chained digests of the full chunks of ``tokens``, first to last (see above)."""
    size = namespace.chunk_tokens
    num_chunks = len(tokens) // size
    if max_chunks is not None:
        num_chunks = min(num_chunks, max_chunks)
    link = namespace.digest
    links = []
    for index in range(num_chunks):
        chunk = tokens[index * size : (index + 1) * size]
        link = hashlib.blake2b(
            link + chunk.tobytes(), digest_size=DIGEST_BYTES, person=b"kvcache.chunk"
        ).digest()
        links.append(link)
    return links


def state_tail(namespace: Namespace, tokens: np.ndarray, links: list[bytes]) -> bytes:
    """The digest naming exactly ``tokens``, given their :func:`chunk_links` (see above)."""
    tail = tokens[len(links) * namespace.chunk_tokens :]
    last = links[-1] if links else namespace.digest
    return hashlib.blake2b(
        last + tail.tobytes(), digest_size=DIGEST_BYTES, person=b"kvcache.tail"
    ).digest()


def state_key(namespace: Namespace, num_tokens: int, tail: bytes) -> str:
    """The key of a whole state of ``num_tokens`` tokens whose :func:`state_tail` is ``tail``."""
    return f"{namespace.label}t{num_tokens}:{tail.hex()}"
