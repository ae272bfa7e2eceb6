"""The remote tier: a Redis / Valkey server or Cluster as the last link of a pool's chain.

A pool created with ``remote=URL, namespace=NS`` (``--remote``/``--namespace``)
keeps both in its header, so every process that opens it uses the same remote.
Hosts whose pools name the same remote and namespace share what they store:

- a get that misses every local tier asks the remote (one bounded call) and
  promotes what it finds into the pool it was asked of;
- ``PrefixCache.lookup`` and ``retrieve`` ask about all the chunks missing
  locally in one pipelined round trip (``Pool.count_present``, ``Pool.prefetch``);
- entries the bottom local tier evicts are *demoted* to the remote, or, with
  ``write_through``, every put is sent at once (so other hosts see it at once);
  either way by a background writer, never on the caller's time;
- a failing remote is a miss, never an error (``link``).

Modules: ``urls`` (URLs, namespaces, passwords, the redis-py client),
``records`` (how an entry lies in Redis, verified on every read), ``link``
(bounded calls, down/up, the writer), ``tier`` (the remote as a tier of a
pool's ``kvcache.chain.Chain``: fetch, demote, write through, its counters).
"""

from .link import RemoteLink
from .urls import PASSWORD_ENV, RemoteSpec

__all__ = ["PASSWORD_ENV", "RemoteLink", "RemoteSpec"]
