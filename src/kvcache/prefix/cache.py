"""PrefixCache: store, find and fetch the KV of token prefixes in a pool.

Each full chunk of a prompt is one pool entry (see ``keys`` for its key and
``tensors`` for its bytes), so any process attached to the pool reuses what
any other stored. Reads trust nothing: a chunk that is missing, evicted
under our feet, or damaged ends the prefix there, so a hit can be shorter
than ``lookup`` promised but never holds wrong data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..accesslog import chunk_id, chunk_ids
from ..codec import byte_view
from ..counters import LOOKUP, RETRIEVE
from ..errors import InvalidArgument
from ..lifecycle import create as create_pool
from ..policies import get_policy
from ..pool import Pool
from ..units import whole_number
from .arrays import like
from .buffers import spares
from .fetch import fetch_chunks
from .keys import Namespace, as_tokens, chunk_keys
from .kvlayout import KVLayout
from .tensors import TRAILER_BYTES, KVSource, chunk_view, layout_array, seal, trailer_head


class PrefixCache:
    """The KV of token prefixes of one model, kept in a pool by chunks of ``chunk_tokens``.

    Args:
        pool: the pool to keep chunks in (``kvcache.open(name)``); one made for
            it should use the ``prefix`` policy (``PrefixCache.create`` does).
        model: the model's id; chunks are never shared between ids.
        layout: the model's KV layout and element type.
        chunk_tokens: tokens per chunk. Only full chunks are cached, so
            smaller chunks reuse more of a prompt, at one pool entry each.
        salt: a tenant id or other separator; caches with different salts
            never see each other's chunks.

    Example::

        layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")
        pc = PrefixCache(kvcache.open("llama-cache"), "llama-3-8b-instruct", layout)
        pc.store(token_ids, kv)          # (layers, 2, kv_heads, tokens, head_dim)
        kv, n = pc.retrieve(token_ids)   # the first n tokens' KV, same shape
    """

    def __init__(
        self,
        pool: Pool,
        model: str,
        layout: KVLayout,
        *,
        chunk_tokens: int = 256,
        salt: str | bytes | None = None,
    ) -> None:
        if not isinstance(pool, Pool):
            raise InvalidArgument(f"pool must be a kvcache.Pool, not {type(pool).__name__}")
        self.pool = pool
        # a prefix-tracking pool may decline a chunk (not admitted, or its parent gone)
        self._may_decline = get_policy(pool.config.policy).tracks_prefixes
        self.namespace = Namespace(model, layout, chunk_tokens, salt)
        self.layout = layout
        self.chunk_tokens = chunk_tokens
        self._chunk_bytes = chunk_tokens * layout.token_bytes

    @classmethod
    def create(
        cls,
        name: str,
        size: str | int,
        model: str,
        layout: KVLayout,
        *,
        chunk_tokens: int = 256,
        salt: str | bytes | None = None,
        policy: str = "prefix",
        **options: Any,
    ) -> PrefixCache:
        """Create a pool for prompt prefixes and a cache over it: the way to make one.

        Its policy defaults to ``prefix`` (``kvcache.create``'s default, ``lru``,
        is for pools of other values): it knows each chunk's parent and admits
        new chunks by how often they were asked for (docs/simulate.md, "Choosing a policy").

        Args:
            name: the pool's name, as ``kvcache.create`` takes it.
            size: the pool's size, as ``kvcache.create`` takes it.
            model: as the constructor takes it.
            layout: as the constructor takes it.
            chunk_tokens: as the constructor takes it.
            salt: as the constructor takes it.
            **options: the rest of ``kvcache.create``'s options (``page_size``,
                ``prealloc``, ``spill_to``, ...).

        Raises:
            PoolExistsError: a pool of that name exists (``kvcache.open`` it and
                pass it to the constructor instead).
        """
        return cls(
            create_pool(name, size, policy=policy, **options),
            model,
            layout,
            chunk_tokens=chunk_tokens,
            salt=salt,
        )

    def chunk_keys(self, token_ids: object) -> list[str]:
        """The pool keys of the full chunks of ``token_ids``, first to last."""
        return chunk_keys(self.namespace, as_tokens(token_ids))

    def lookup(self, token_ids: object) -> int:
        """How many leading tokens of ``token_ids`` have cached KV (a multiple of chunk_tokens).

        A presence check only (no copy, no effect on recency, hit or token counts): a
        chunk evicted or found damaged before ``retrieve`` shortens that hit. The
        chunks missing locally cost one round trip to a remote tier, not one each.
        """
        return self.lookup_keys(self.chunk_keys(token_ids))

    def lookup_keys(self, keys: list[str]) -> int:
        """:meth:`lookup` of a prompt whose :meth:`chunk_keys` the caller kept (or a
        leading run of them): for asking again about a prompt without hashing it again."""
        started = self.pool.latency.start(LOOKUP)
        found = self.pool.count_present(keys) * self.chunk_tokens
        if started:
            self.pool.latency.stop(LOOKUP, started)
        return found

    def new_buffer(self, num_tokens: int) -> np.ndarray:
        """An uninitialised ``out=`` buffer for :meth:`retrieve` of up to ``num_tokens`` tokens.

        Its shape is (layers, 2, kv_heads, num_tokens, head_dim); in memory the
        tokens are outermost, so each chunk is filled with a single copy.
        """
        whole_number(num_tokens, "num_tokens")
        flat = spares.take(num_tokens * self.layout.token_bytes)
        return chunk_view(flat, self.layout, num_tokens).transpose(1, 2, 3, 0, 4)

    def retrieve(
        self,
        token_ids: object,
        *,
        out: Any = None,
        max_tokens: int | None = None,
        first_token: int = 0,
    ) -> tuple[Any, int]:
        """The KV of the longest cached prefix of ``token_ids``, and its length in tokens.

        Args:
            token_ids: the prompt (a list, numpy array or torch tensor of ids).
            out: fill this instead of a new array: one from :meth:`new_buffer`,
                or any numpy array or CPU torch tensor of the cache's dtype with
                the same memory order -- C-contiguous (tokens, layers, 2,
                kv_heads, head_dim), or that transposed to (layers, 2, kv_heads,
                tokens, head_dim). Its first token is ``first_token``; its
                tokens past the hit are overwritten with undefined bytes.
            max_tokens: fetch at most this many tokens (counted from token 0).
            first_token: fetch from this token on (a multiple of chunk_tokens):
                the caller holds the KV of the tokens before it (an engine's
                own prefix cache), so those chunks are neither read nor checked.

        Returns:
            ``(kv, n)``: n is where the hit ends, a multiple of chunk_tokens
            (``first_token`` when the chunk there is missing, or ``max_tokens``
            rounded down to a chunk if that is less; 0 on a miss), and
            kv holds tokens ``first_token .. n-1``: (layers, 2, kv_heads,
            n - first_token, head_dim). It is a numpy array (bfloat16 as uint16
            bit patterns), or a view of ``out`` if that is a torch tensor.
            The pool's token counters count the tokens from ``first_token`` on.

        Raises:
            InvalidArgument: ``out`` has the wrong dtype, shape or memory order,
                or ``first_token`` is not a multiple of chunk_tokens.
        """
        started = self.pool.latency.start(RETRIEVE)
        tokens = as_tokens(token_ids)
        limit = len(tokens) if max_tokens is None else whole_number(max_tokens, "max_tokens")
        whole_number(first_token, "first_token", 0, len(tokens))
        if out is None:
            keys = chunk_keys(self.namespace, tokens, limit // self.chunk_tokens)
        else:
            flat, capacity = self._flat_bytes(out)
            end = min(limit, first_token + capacity)
            keys = chunk_keys(self.namespace, tokens, end // self.chunk_tokens)
        skip = min(self._first_chunk(first_token), len(keys))
        if out is None:
            flat = spares.take((len(keys) - skip) * self._chunk_bytes + TRAILER_BYTES)
        wanted = keys[skip:]
        heads = [self._head(index) for index in range(skip, len(keys))]
        if self.pool.remote is not None:
            self.pool.prefetch(wanted)  # what only the remote has, in one round trip
        self.pool.read_ahead(wanted)  # a disk tier's chunks, all asked for at once
        num_chunks = fetch_chunks(self.pool, wanted, heads, self._chunk_bytes, flat)
        num_tokens = num_chunks * self.chunk_tokens
        access_log = self.pool.access_log
        if access_log is not None:  # the request's whole chain, as the trace format has it
            access_log.write(
                self._logged("retrieve", keys, hit=skip + num_chunks, input_length=len(tokens))
            )
        kv = chunk_view(flat, self.layout, num_tokens).transpose(1, 2, 3, 0, 4)
        asked = len(tokens) - first_token
        if asked > 0:
            self.pool.count_tokens(self.namespace.model, queried=asked, hit=num_tokens)
        if started:
            self.pool.latency.stop(RETRIEVE, started)
        return like(out, kv, self.layout.dtype), skip * self.chunk_tokens + num_tokens

    def store(
        self,
        token_ids: object,
        kv: Any,
        *,
        priority: int = 0,
        ttl: float | str | None = None,
        first_token: int = 0,
    ) -> int:
        """Cache the KV of every full chunk of ``token_ids`` that the pool lacks.

        Args:
            token_ids: the tokens ``kv`` was computed for.
            kv: their KV, numpy or CPU torch, of the cache's dtype: one array
                (layers, 2, kv_heads, tokens, head_dim), or a sequence of one
                (keys, values) pair per layer, each (kv_heads, tokens, head_dim)
                or (1, kv_heads, tokens, head_dim). It may cover more tokens
                than ``token_ids``; the extra ones are ignored.
            priority: passed to :meth:`Pool.put` for every chunk.
            ttl: passed to :meth:`Pool.put` for every chunk.
            first_token: ``kv`` starts at this token of ``token_ids`` (a multiple
                of chunk_tokens): the chunks before it are already cached, so KV
                on a GPU need only copy the rest to the host. If one of them is
                missing after all, nothing after it is stored (it would be
                unreachable).

        Returns:
            How many tokens' KV were written (chunks already cached are skipped;
            a ``prefix`` pool may decline a chunk, and then the rest).

        Raises:
            InvalidArgument: kv does not match the layout or covers too few tokens.
            ValueTooLargeError: a chunk is larger than the pool: use smaller chunks.
        """
        tokens = as_tokens(token_ids)
        size = self.chunk_tokens
        whole_number(first_token, "first_token", 0, len(tokens))
        self._first_chunk(first_token)
        source = KVSource(kv, self.layout, first_token)
        if source.num_tokens < len(tokens):
            raise InvalidArgument(
                f"kv covers {source.num_tokens} tokens but token_ids has {len(tokens)}: "
                "pass the tokens the KV was computed for"
            )
        buffer = np.empty(self._chunk_bytes + TRAILER_BYTES, np.uint8)  # reused: put copies it
        chunk = chunk_view(buffer, self.layout, size)
        written: list[int] = []
        keys = chunk_keys(self.namespace, tokens)
        cached = self.pool.count_present(keys)  # the leading run, remote included: one trip
        for index, key in enumerate(keys):
            if index < cached or self.pool.in_local_tiers(key):
                continue
            if index * size < first_token:
                break  # a chunk gone that we have no KV for: what follows it is unreachable
            source.copy_tokens(index * size, (index + 1) * size, chunk)
            seal(buffer, self._head(index))
            # a memoryview, not the array, so that the pool stores plain bytes (no array header)
            parent = keys[index - 1] if index else None  # the prefix it extends (policy ``prefix``)
            self.pool.put(key, byte_view(buffer), priority=priority, ttl=ttl, parent=parent)  # type: ignore[arg-type]
            if self._may_decline and not self.pool.in_local_tiers(key):
                break  # declined: so would be every chunk after it (no parent)
            written.append(index)
        access_log = self.pool.access_log
        if written and access_log is not None:
            first = written[0]
            parent_id = chunk_id(keys[first - 1]) if first else 0
            stored = [keys[index] for index in written]
            access_log.write(self._logged("store", stored, parent=parent_id, depth=first))
        if written:
            self.pool.count_tokens(self.namespace.model, stored=len(written) * size)
        return len(written) * size

    def __repr__(self) -> str:
        ns = self.namespace
        return (
            f"<kvcache.PrefixCache {ns.model!r} on pool {self.pool.name!r}, "
            f"{self.chunk_tokens}-token chunks, {self.layout}>"
        )

    def _logged(self, op: str, keys: list[str], **fields: int) -> dict[str, object]:
        """An access log line (see :mod:`kvcache.accesslog`)."""
        return {
            "op": op,
            "hash_ids": chunk_ids(keys),
            **fields,
            "block_tokens": self.chunk_tokens,
            "block_bytes": self._chunk_bytes,
        }

    def _first_chunk(self, first_token: int) -> int:
        """The index of the chunk that starts at ``first_token``.

        Raises:
            InvalidArgument: ``first_token`` is negative or not a multiple of chunk_tokens.
        """
        whole_number(first_token, "first_token")
        if first_token % self.chunk_tokens:
            raise InvalidArgument(
                f"first_token must be a multiple of chunk_tokens ({self.chunk_tokens}), "
                f"not {first_token}"
            )
        return first_token // self.chunk_tokens

    def _head(self, index: int) -> bytes:
        return trailer_head(self.layout, self.chunk_tokens, index, self.namespace.digest)

    def _flat_bytes(self, out: Any) -> tuple[np.ndarray, int]:
        """``out``'s memory as uint8, and how many tokens it holds; see :meth:`retrieve`."""
        array = layout_array(out, self.layout, "out")
        token_shape = self.layout.token_shape

        def token_major(a: np.ndarray) -> bool:
            return a.ndim == 5 and a.shape[1:] == token_shape and a.flags.c_contiguous

        if not token_major(array) and array.ndim == 5:
            array = array.transpose(3, 0, 1, 2, 4)  # given as (layers, 2, heads, tokens, dim)
        if not token_major(array):
            raise InvalidArgument(
                "out must be a buffer from PrefixCache.new_buffer(), or a C-contiguous array of "
                f"shape (tokens, {', '.join(map(str, token_shape))}) or that transposed to "
                f"(layers, 2, kv_heads, tokens, head_dim); got shape {tuple(out.shape)}"
            )
        if not array.flags.writeable:
            raise InvalidArgument("out must be writable")
        return array.reshape(-1).view(np.uint8), array.shape[0]
