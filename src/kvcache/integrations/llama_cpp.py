"""llama-cpp-python: prompt states shared by every process on the machine, through a pool.

::

    from llama_cpp import Llama
    from kvcache.integrations import llama_cpp as kvllama
    llm = Llama(model_path="model.gguf", n_ctx=4096)
    llm.set_cache(kvllama.PoolCache(kvcache.open("llama-cache"), llama=llm))
    llm("...long system prompt... question")  # another process with the same prefix skips it

:class:`PoolCache` is a ``llama_cpp.BaseLlamaCache``: ``Llama`` asks it for
the state that shares the longest prefix with each prompt, loads it, and
stores its state after each completion. Unlike ``LlamaRAMCache`` (one
process) and ``LlamaDiskCache`` (whose capacity never reaches diskcache), the
states live in a kvcache pool: shared by every process that opens it,
bounded by the pool's size and policy, warm after a restart (``persist`` /
``restore``), and found without comparing the prompt with every stored key
(see :mod:`kvcache.prefix.states`).

Keys name the model, the context settings a state depends on and the tokens:

- ``llama=llm`` (recommended): the model file's identity (its size and a
  hash of its first and last MiB, unless ``model_id`` is given) and the
  context's settings -- n_ctx, n_batch, KV element types, flash attention,
  RoPE and YaRN scaling, logits_all, LoRA -- and the llama-cpp-python
  version, whose state format is llama.cpp's own;
- ``model_id`` alone, naming the model yourself: every process that uses the
  id must build its ``Llama`` with the same settings (the cache cannot see
  them), and states keep their logits, as llama-cpp-python's own caches do.

A state is stored without pickle, as the fields ``Llama.load_state`` needs,
in the payload of a :class:`~kvcache.prefix.StateCache` record (which holds
the tokens and the checksum)::

    offset  size  field
    0       4     magic b"KVLL"
    4       2     format version (1)
    6       2     flags: bit 0 = scores stored
    8       8     n_tokens (the record's token count)
    16      8     n_ctx (length of input_ids)
    24      8     seed (signed)
    32      8     scores rows
    40      8     scores columns (vocabulary size)
    48      8     llama_state bytes
    56      8     reserved (0)
    64      ...   scores, rows x columns float32 (if stored), then llama_state

Scores are the logits of every position; ``Llama`` fills them only with
``logits_all=True`` (for ``logprobs``), otherwise they are uninitialised
memory of n_batch x vocabulary floats. With ``llama=`` a state of a context
without ``logits_all`` is stored without them (zeros come back).

Needs ``pip install 'kvcache[llama-cpp]'`` (llama-cpp-python builds llama.cpp from source).
"""

from __future__ import annotations

import hashlib
import os
import struct
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DependencyError, InvalidArgument, ValueTooLargeError
from ..pool import Pool
from ..prefix import StateCache, StateHit, StateLayout
from ..prefix.keys import as_tokens

try:
    import llama_cpp
    from llama_cpp.llama import Llama, LlamaState
    from llama_cpp.llama_cache import BaseLlamaCache
except ImportError as exc:
    raise DependencyError(
        f"kvcache.integrations.llama_cpp needs llama-cpp-python ({exc}): "
        "pip install 'kvcache[llama-cpp]'"
    ) from exc

HEAD = struct.Struct("<4sHHQQqQQQ8x")
MAGIC, VERSION = b"KVLL", 1
SCORES_STORED = 1
_MAX_CTX = 1 << 26  # a bound no context approaches: a bad length fails before any allocation
_MAX_SCORES = 1 << 34  # rows x columns: scores not stored come back as zeros of that shape
_CONTEXT_FIELDS = (
    "n_seq_max", "rope_scaling_type", "pooling_type", "attention_type", "flash_attn_type",
    "rope_freq_base", "rope_freq_scale", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_fast",
    "yarn_beta_slow", "yarn_orig_ctx", "type_k", "type_v", "embeddings", "swa_full", "kv_unified",
)  # fmt: skip
"""``llama_context_params`` fields that change what a state holds or how it loads."""
_HASHED_BYTES = 1 << 20
assert HEAD.size == 64


def model_file_id(path: str | os.PathLike[str]) -> str:
    """A model file's identity: its size and BLAKE2b of its first and last MiB.

    Cheap for a multi-GB file, the same for every copy of it; a file whose
    weights differ only in the middle needs a ``model_id`` of its own.
    """
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        digest.update(file.read(_HASHED_BYTES))
        file.seek(max(0, size - _HASHED_BYTES))
        digest.update(file.read(_HASHED_BYTES))
    return f"gguf:{size}:{digest.hexdigest()}"


def context_layout(llama: Llama | None) -> StateLayout:
    """The settings a ``Llama``'s states depend on (or "unspecified" for None)."""
    version = getattr(llama_cpp, "__version__", "unknown")
    if llama is None:
        return StateLayout.of("llama.cpp", context="unspecified", llama_cpp_python=version)
    params = llama.context_params
    settings = {name: getattr(params, name) for name in _CONTEXT_FIELDS if hasattr(params, name)}
    settings.update(
        n_ctx=llama.n_ctx(),
        n_batch=llama.n_batch,
        logits_all=getattr(llama, "_logits_all", "unknown"),
        lora=(getattr(llama, "lora_path", None), getattr(llama, "lora_scale", None)),
    )
    return StateLayout.of("llama.cpp", llama_cpp_python=version, **settings)


class PoolCache(BaseLlamaCache):
    """A llama-cpp-python prompt cache in a kvcache pool, shared by every process.

    Args:
        pool: the pool to keep states in (``kvcache.open(name)``).
        model_id: the model's id; default the model file's identity (needs ``llama``).
        llama: the ``Llama`` this cache serves: its model file and context
            settings go into the keys (see the module's notes).
        chunk_tokens: tokens between prefix markers: a stored state is found
            by a prompt sharing at least one full chunk with it.
        salt: a tenant id or other separator; caches with different salts
            never see each other's states.
        priority, ttl: passed to :meth:`Pool.put` for every state.

    Raises:
        InvalidArgument: neither ``model_id`` nor ``llama``, or bad arguments.
    """

    def __init__(
        self,
        pool: Pool,
        model_id: str | None = None,
        *,
        llama: Llama | None = None,
        chunk_tokens: int = 256,
        salt: str | bytes | None = None,
        priority: int = 0,
        ttl: float | str | None = None,
    ) -> None:
        if llama is not None and not isinstance(llama, Llama):
            raise InvalidArgument(f"llama must be a llama_cpp.Llama, not {type(llama).__name__}")
        if model_id is None:
            if llama is None:
                raise InvalidArgument(
                    "PoolCache needs model_id='...' or llama=<the Llama it serves>, "
                    "so that states of different models never meet"
                )
            model_id = model_file_id(llama.model_path)
        self.states = StateCache(  # checks the pool and the rest
            pool, model_id, context_layout(llama), chunk_tokens=chunk_tokens, salt=salt
        )
        super().__init__(capacity_bytes=pool.config.size_bytes)
        self.pool = pool
        self._keep_scores = llama is None or getattr(llama, "_logits_all", True)
        self._put_options: dict[str, Any] = {"priority": priority, "ttl": ttl}
        self._warned_too_large = False

    @property
    def cache_size(self) -> int:
        """Bytes in use in the pool (every entry in it, this cache's and any other's)."""
        return self.pool.stats().used_bytes

    def __getitem__(self, key: Sequence[int]) -> LlamaState:
        """The stored state sharing the longest prefix with ``key``.

        Raises:
            KeyError: none (what ``Llama`` takes as a miss).
        """
        hit = self.states.get(key)
        state = None if hit is None else decode(hit)
        if state is None:
            raise KeyError("no state shares a prefix with these tokens")
        return state

    def _find_longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        """The tokens of the stored state ``self[key]`` would return (BaseLlamaCache's hook)."""
        hit = self.states.get(key, count=False)
        return None if hit is None else tuple(hit.tokens.tolist())

    def __contains__(self, key: Sequence[int]) -> bool:  # type: ignore[override]
        """Whether ``self[key]`` finds a state (it reads and checks it)."""
        hit = self.states.get(key, count=False)
        return hit is not None and decode(hit) is not None

    def __setitem__(self, key: Sequence[int], value: LlamaState) -> None:
        """Store ``value``, the state after evaluating ``key`` (or a prefix of it).

        The state is filed under the tokens it holds (``value.input_ids[:n_tokens]``);
        ``Llama`` passes the prompt and completion, whose last token is not evaluated.

        A state larger than the whole pool is not cached (a warning, once per
        cache): a cache that cannot keep something must not fail the ``Llama`` call
        that offers it, as ``LlamaRAMCache`` does not.

        Raises:
            InvalidArgument: ``value`` is not a ``LlamaState``, or ``key`` and its tokens differ.
        """
        if not isinstance(value, LlamaState):
            raise InvalidArgument(
                f"value must be a llama_cpp LlamaState, not {type(value).__name__}"
            )
        tokens, pieces = encode(value, keep_scores=self._keep_scores)
        given = as_tokens(list(key))
        common = min(len(given), len(tokens))
        if not np.array_equal(given[:common], tokens[:common]):
            raise InvalidArgument(
                "the state was computed for other tokens than the key: store llm.save_state() "
                "under the tokens the Llama evaluated"
            )
        if not len(tokens):
            return
        try:
            self.states.put(tokens, pieces, **self._put_options)
        except ValueTooLargeError as exc:
            if not self._warned_too_large:
                warnings.warn(f"{exc}: this state is not cached", RuntimeWarning, stacklevel=2)
                self._warned_too_large = True

    def __repr__(self) -> str:
        ns = self.states.namespace
        return f"<kvcache llama_cpp.PoolCache {ns.model!r} on pool {self.pool.name!r}>"


def encode(state: LlamaState, *, keep_scores: bool = True) -> tuple[np.ndarray, list[Any]]:
    """A state's tokens and its payload pieces in the format drawn above.

    Raises:
        InvalidArgument: its fields are inconsistent.
    """
    input_ids = np.asarray(state.input_ids)
    n_tokens, n_ctx = int(state.n_tokens), len(input_ids)
    scores = np.ascontiguousarray(state.scores, dtype="<f4")
    llama_state = memoryview(state.llama_state).cast("B")[: int(state.llama_state_size)]
    if not 0 <= n_tokens <= n_ctx <= _MAX_CTX or scores.ndim != 2:
        raise InvalidArgument(
            f"inconsistent LlamaState: n_tokens {n_tokens}, {n_ctx} input ids, "
            f"scores of shape {scores.shape}"
        )
    flags = SCORES_STORED if keep_scores else 0
    head = HEAD.pack(
        MAGIC, VERSION, flags, n_tokens, n_ctx, int(state.seed), *scores.shape, llama_state.nbytes
    )
    pieces = [head, scores, llama_state] if keep_scores else [head, llama_state]
    return input_ids[:n_tokens], pieces


def decode(hit: StateHit) -> LlamaState | None:
    """The ``LlamaState`` a checked record holds; None if its payload does not parse.

    Its ``llama_state`` is a read-only memoryview of the value read from the
    pool, not ``bytes``: ``Llama.load_state`` copies it into llama.cpp, and a
    ``bytes`` copy first cost 2-15 ms more per 16 MiB state here.
    """
    payload = hit.payload
    if payload.nbytes < HEAD.size:
        return None
    magic, version, flags, n_tokens, n_ctx, seed, rows, cols, state_bytes = HEAD.unpack_from(
        payload
    )
    scores_bytes = 4 * rows * cols if flags & SCORES_STORED else 0
    if (
        (magic, version) != (MAGIC, VERSION)
        or flags & ~SCORES_STORED
        or n_tokens != len(hit.tokens)
        or not n_tokens <= n_ctx <= _MAX_CTX
        or rows * cols > _MAX_SCORES
        or payload.nbytes != HEAD.size + scores_bytes + state_bytes
    ):
        return None
    input_ids = np.full(n_ctx, -1, np.intc)  # -1 past n_tokens: no prompt token matches it
    input_ids[:n_tokens] = hit.tokens
    start = HEAD.size + scores_bytes
    if flags & SCORES_STORED:
        scores = np.frombuffer(payload[HEAD.size : start], "<f4").reshape(rows, cols)
    else:
        scores = np.zeros((rows, cols), np.float32)
    return LlamaState(
        input_ids=input_ids,
        scores=scores,
        n_tokens=n_tokens,
        llama_state=payload[start:],  # bytes-like, read-only: load_state copies it once anyway
        llama_state_size=state_bytes,
        seed=seed,
    )
