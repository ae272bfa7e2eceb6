"""Token prefixes: the KV of a prompt's leading tokens, shared through a pool.

Requests that share a prompt prefix (system prompt, document, earlier chat
turns) reuse its attention keys and values instead of recomputing them, in
any process attached to the pool. The parts, bottom up:

- ``kvlayout``  ``KVLayout``: layers, KV heads, head size, element type
- ``statelayout`` ``StateLayout``: an engine and the settings its whole states depend on
- ``arrays``    numpy views of numpy arrays and torch tensors (torch never imported)
- ``keys``      the namespace digest and BLAKE2b keys chained over token chunks
- ``tensors``   a chunk's bytes: token-major payload and a checksummed trailer
- ``buffers``   large buffers for retrieved KV, reused once nothing views them
- ``fetch``     copy a run of chunks into one buffer, checking each
- ``cache``     ``PrefixCache``: store / lookup / retrieve by prompt
- ``states``    ``StateCache``: whole engine states (llama.cpp's), found by the
                longest shared prefix through per-chunk markers on the same keys

Model integrations (``kvcache.integrations``) sit above this layer.
"""

from .cache import PrefixCache
from .keys import Namespace
from .kvlayout import DTYPES, KVLayout
from .statelayout import StateLayout
from .states import StateCache, StateHit

__all__ = [
    "DTYPES",
    "KVLayout",
    "Namespace",
    "PrefixCache",
    "StateCache",
    "StateHit",
    "StateLayout",
]
