"""A llama-server proxy that keeps prompts warm across restarts, slots, servers and machines.

``cortex cache llama-server --pool NAME --listen HOST:PORT -- <llama-server options>``
runs llama-server (or fronts one, ``--upstream URL --slot-dir DIR``) and caches
its slots' states in a kvcache pool: a restarted server, a second server on
the machine, or one on another machine sharing the pool's Redis tier finds
every known prompt prefix warm. See ``docs/llama-server.md``. The parts:

- ``identity``: what states are valid for -- the GGUF's content hash, the
  server's KV-relevant settings, its build -- named in every key;
- ``slotfile``: the tokens a slot file holds, read from its head;
- ``store``: the pool side (a ``StateCache``), which never fails a request,
  and the problems it counts;
- ``exchange``: restores and saves through the private slot folder;
- ``slots``: which request holds which slot, what each slot holds, the line;
- ``upstream`` and ``forward``: calls to the server, and relaying requests
  byte for byte;
- ``proxy``: one completion request, from tokens to save;
- ``supervisor``: starting and restarting llama-server;
- ``app``: configuration and :func:`serve`, which joins them.

Needs ``pip install 'kvcache[llama-server]'`` (aiohttp) and a llama-server
binary (``scripts/setup.sh`` builds one into ``.venv/bin``).
"""

from __future__ import annotations

from ...errors import DependencyError

try:
    import aiohttp  # noqa: F401
except ImportError as exc:
    raise DependencyError(
        f"kvcache.integrations.llama_server needs aiohttp ({exc}): "
        "pip install 'kvcache[llama-server]'"
    ) from exc

from .app import ProxyConfig, serve

__all__ = ["ProxyConfig", "serve"]
