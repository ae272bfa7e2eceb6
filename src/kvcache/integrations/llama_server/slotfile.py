"""llama-server's slot files: the tokens a saved slot holds, read from the file's head.

``POST /slots/{id}?action=save`` writes ``llama_state_seq_save_file``'s format
(llama.cpp's ``LLAMA_STATE_SEQ_VERSION`` 3), whose token list the server fills
with its own serialised ``server_tokens``::

    offset  size  field
    0       4     magic 0x67677371 ("ggsq"), little-endian u32
    4       4     version (3)
    8       4     n_packed: int32 words that follow
    12      4n    packed words:
                    -1 (LLAMA_TOKEN_NULL), 1 (server tokens version),
                    n_tokens, the tokens, 0 (media chunks)
                  or, from servers before that format, the plain token list
    12+4n   ...   the sequence's KV, opaque here

The proxy files a saved slot under the tokens read here (what the server
itself says it holds, prompt and generated tokens alike), and checks a stored
state's tokens against them before handing it back to a server. Media chunks
(a multimodal prompt) are not cached: their KV depends on more than tokens.
"""

from __future__ import annotations

import struct

import numpy as np

MAGIC = 0x67677371
VERSION = 3
TOKEN_NULL = -1
SERVER_TOKENS_VERSION = 1
HEAD = struct.Struct("<III")
_MAX_TOKENS = 1 << 26  # no context comes near it: a bad count fails before any allocation


def read_tokens(data: bytes | memoryview) -> np.ndarray | None:
    """The tokens a slot file holds (int64), or None if its head is not one we read.

    Args:
        data: the file's bytes (at least its head: 12 bytes and the packed words).
    """
    view = memoryview(data).cast("B")
    if view.nbytes < HEAD.size:
        return None
    magic, version, num_packed = HEAD.unpack_from(view)
    if (magic, version) != (MAGIC, VERSION) or num_packed > _MAX_TOKENS:
        return None
    if view.nbytes < HEAD.size + 4 * num_packed:
        return None
    packed = np.frombuffer(view, "<i4", count=num_packed, offset=HEAD.size)
    if not num_packed or packed[0] != TOKEN_NULL:
        return packed.astype(np.int64)  # the older plain list
    if num_packed < 4 or packed[1] != SERVER_TOKENS_VERSION:
        return None
    num_tokens = int(packed[2])
    if num_tokens < 0 or num_packed != num_tokens + 4 or packed[3 + num_tokens] != 0:
        return None  # media chunks follow, or the words do not add up
    return packed[3 : 3 + num_tokens].astype(np.int64)
