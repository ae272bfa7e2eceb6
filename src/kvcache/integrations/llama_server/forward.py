"""Forwarding one HTTP request to llama-server and its answer back, bytes unchanged.

The answer is relayed as it arrives (Server-Sent Events stay a stream) with
its status, headers and body bytes as the server sent them: the client
session is made with ``auto_decompress=False``, and only hop-by-hop headers
(RFC 9110 section 7.6.1) are left for each connection to set. The proxy
reads ``timings.cache_n`` from the last bytes of a completion's answer
(:class:`CacheWatch`) without changing them.
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .upstream import Upstream

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host",
})  # fmt: skip
_CONNECT_TIMEOUT_S = 10.0
_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')
_TAIL_BYTES = 16 << 10  # the final event or body's "timings" lies in its last few hundred bytes


class CacheWatch:
    """Keeps the last bytes of an answer to read ``cache_n`` from, and whether it ended whole."""

    def __init__(self) -> None:
        self._tail = bytearray()
        self.complete = False

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the answer."""
        self._tail += chunk
        if len(self._tail) > 2 * _TAIL_BYTES:
            del self._tail[:-_TAIL_BYTES]

    def cache_n(self) -> int | None:
        """The last ``cache_n`` in the answer: prompt tokens the server took from its slot."""
        found = _CACHE_N.findall(self._tail)
        return int(found[-1]) if found else None


def error_response(status: int, message: str) -> web.Response:
    """An answer in llama-server's own error shape, for when the server cannot answer."""
    kind = "unavailable_error" if status in (502, 503) else "server_error"
    doc = {"error": {"code": status, "message": message, "type": kind}}
    return web.Response(status=status, text=json.dumps(doc), content_type="application/json")


class Unreachable(Exception):
    """The server took no request: it is down or restarting (safe to send again)."""


async def forward(
    request: web.Request,
    upstream: Upstream,
    body: bytes,
    watch: CacheWatch | None = None,
) -> web.StreamResponse:
    """Send ``request`` (with ``body``) to the server and relay its answer as it comes.

    A client that leaves mid-answer closes the server's connection too (the
    server then stops generating), and ``watch.complete`` stays False.

    Raises:
        Unreachable: no answer began: the connection was refused or dropped
            before the server answered (a server that died; the caller may wait
            for it and send again).
    """
    headers = CIMultiDict(
        (name, value)
        for name, value in request.headers.items()
        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length"
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S)
    try:
        answer = await upstream.session.request(
            request.method, upstream.url + request.path_qs, headers=headers, data=body,
            timeout=timeout,
        )  # fmt: skip
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
    async with answer:
        response = web.StreamResponse(status=answer.status, reason=answer.reason)
        for name, value in answer.headers.items():
            if name.lower() not in HOP_BY_HOP:
                response.headers.add(name, value)
        await response.prepare(request)
        try:
            async for chunk in answer.content.iter_any():
                if watch is not None:
                    watch.feed(chunk)
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError, asyncio.TimeoutError):
            return response  # either side left: nothing more to relay
        if watch is not None:
            watch.complete = True
    return response
