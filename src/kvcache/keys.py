"""Keys: what a key may be, its stored bytes and the 128-bit hash the index files it by.

A key is ``str`` (stored as UTF-8, and given back as ``str``) or ``bytes``, 1
to ``MAX_KEY_BYTES`` long. The index keeps only the xxh3-128 hash; the whole
key is stored with the value, so a lookup confirms it and listings show it.
"""

from __future__ import annotations

import struct

import xxhash

from .config import MAX_KEY_BYTES
from .errors import InvalidArgument
from .layout import KEY_IS_STR

Key = str | bytes
_HASH_HALVES = struct.Struct("<qq")


def encode_key(key: Key) -> tuple[bytes, int]:
    """The bytes stored for ``key``, and the entry flags that say how to give it back.

    Raises:
        InvalidArgument: not ``str``/``bytes``, empty, too long, or text that
            UTF-8 cannot encode (a lone surrogate, as ``surrogateescape`` makes).
    """
    if isinstance(key, str):
        try:
            data, flags = key.encode("utf-8"), KEY_IS_STR
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"key {key[:40]!r} is not valid Unicode text (a lone surrogate at position "
                f"{exc.start}): fix the text, or pass the key as bytes"
            ) from None
    elif isinstance(key, bytes):
        data, flags = key, 0
    else:
        raise InvalidArgument(f"keys must be str or bytes, not {type(key).__name__}")
    if not 0 < len(data) <= MAX_KEY_BYTES:
        raise InvalidArgument(f"keys must be 1 to {MAX_KEY_BYTES} bytes long, got {len(data)}")
    return data, flags


def key_hash(data: bytes) -> tuple[int, int]:
    """The (low, high) signed halves of the xxh3-128 of a key's bytes, as the index stores them."""
    return _HASH_HALVES.unpack(xxhash.xxh3_128_digest(data))  # type: ignore[return-value]
