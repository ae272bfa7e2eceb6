"""The connector's settings, read from vLLM's ``kv_connector_extra_config``.

::

    --kv-transfer-config '{"kv_connector": "KVCacheConnector",
                           "kv_connector_module_path": "kvcache.integrations.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"pool": "vllm-cache", "size": "16G"}}'

Every key is checked here, once, in both of vLLM's processes (scheduler and
worker), so a typo stops the engine at start with one line that names it
rather than leaving a cache that silently never hits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...errors import InvalidArgument
from ...pool import Pool
from ...units import whole_number

DEFAULT_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class ConnectorSettings:
    """What ``kv_connector_extra_config`` may hold.

    Attributes:
        pool: the pool's name (``kvcache create NAME ...``); required.
        size: create the pool with this size (``"16G"``) if it does not exist;
            without it a missing pool is an error, so a typo in the name cannot
            quietly make a second pool.
        tier: ``cpu`` or ``disk``, for a pool the connector creates.
        chunk_tokens: tokens per pool entry; a multiple of vLLM's block size.
            Smaller chunks reuse more of a prompt at one entry each.
        model_id: the name the KV is kept under; default the model vLLM
            loaded (its path or hub name) and its revision. Give one when two
            paths hold the same weights, or one path holds changing weights.
    """

    pool: str
    size: str | None = None
    tier: str = "cpu"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    model_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.pool, str) or not self.pool:
            raise InvalidArgument(
                'kv_connector_extra_config needs "pool": the name of a kvcache pool '
                "(kvcache create NAME --size 16G --prefix-cache)"
            )
        whole_number(self.chunk_tokens, "chunk_tokens", low=1)
        if self.size is not None and not isinstance(self.size, (str, int)):
            raise InvalidArgument(f'"size" must be a size such as "16G", not {self.size!r}')
        if self.tier not in ("cpu", "disk"):
            raise InvalidArgument(f'"tier" must be "cpu" or "disk", not {self.tier!r}')
        if self.model_id is not None and (not isinstance(self.model_id, str) or not self.model_id):
            raise InvalidArgument(f'"model_id" must be a non-empty string, not {self.model_id!r}')

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None) -> ConnectorSettings:
        """Settings from ``kv_connector_extra_config``.

        Raises:
            InvalidArgument: an unknown key (its name and the known ones), or a bad value.
        """
        extra = dict(extra or {})
        known = cls.__dataclass_fields__
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise InvalidArgument(
                f"kv_connector_extra_config has unknown key(s) {', '.join(unknown)}: "
                f"the kvcache connector takes {', '.join(known)}"
            )
        pool = extra.pop("pool", None)  # missing: refused by __post_init__, with what to do
        return cls(pool, **extra)  # type: ignore[arg-type]

    def open_pool(self) -> Pool:
        """The pool, opened; created first (``prefix`` policy) if ``size`` was given.

        Raises:
            PoolNotFoundError: no such pool and no ``size`` to create it with.
        """
        from ... import lifecycle  # the pool layer, imported where used: settings stay light
        from ...errors import PoolExistsError, PoolNotFoundError

        try:
            return lifecycle.open(self.pool)
        except PoolNotFoundError:
            if self.size is None:
                raise PoolNotFoundError(
                    f"no kvcache pool {self.pool!r}: create it (kvcache create {self.pool} "
                    '--size 16G --prefix-cache) or add "size" to kv_connector_extra_config'
                ) from None
        try:
            return lifecycle.create(self.pool, self.size, policy="prefix", tier=self.tier)
        except PoolExistsError:  # another vLLM process created it first
            return lifecycle.open(self.pool)
