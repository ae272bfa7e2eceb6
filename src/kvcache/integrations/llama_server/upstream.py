"""The llama-server HTTP calls the proxy makes for itself: props, tokens, slot actions.

One ``aiohttp.ClientSession`` per proxy, also used to forward clients'
requests (``app``). Responses are read as bytes and parsed here; every
failure is an :class:`UpstreamError` with the server's own message, which the
callers turn into an uncached request (the cache never fails one).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import numpy as np

from ...errors import KVCacheError

_SLOT_ACTION_TIMEOUT_S = 120.0  # a save or restore waits while the slot is busy (server side)


class UpstreamError(KVCacheError):
    """llama-server refused or failed a call the proxy made, or could not be reached."""


class Upstream:
    """llama-server at ``url``, reached through ``session``.

    Args:
        url: the server's base URL (``http://127.0.0.1:8080``).
        session: the proxy's client session (made with ``auto_decompress=False``).
    """

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.session = session

    async def props(self) -> dict[str, Any]:
        """``GET /props``: the model path, slots, context per slot, build."""
        return await self._call("GET", "/props")

    async def tokenize(self, text: str) -> np.ndarray:
        """The tokens the server makes of ``text`` as a completion prompt (BOS as it adds it)."""
        doc = await self._call(
            "POST", "/tokenize", {"content": text, "add_special": True, "parse_special": True}
        )
        return _tokens(doc.get("tokens"))

    async def apply_template(self, request: Mapping[str, Any]) -> str:
        """The prompt text the server makes of a chat request (its own template and options)."""
        doc = await self._call("POST", "/apply-template", dict(request))
        prompt = doc.get("prompt")
        if not isinstance(prompt, str):
            raise UpstreamError("/apply-template gave no prompt")
        return prompt

    async def slot_action(self, slot: int, action: str, filename: str | None) -> dict[str, Any]:
        """``POST /slots/{slot}?action=...``: save, restore (a file in the slot folder) or erase."""
        body = {} if filename is None else {"filename": filename}
        return await self._call(
            "POST", f"/slots/{slot}?action={action}", body, timeout_s=_SLOT_ACTION_TIMEOUT_S
        )

    async def _call(
        self, method: str, path: str, body: object = None, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        try:
            async with self.session.request(
                method,
                self.url + path,
                json=body,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                raw = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if response.status != 200 or not isinstance(doc, dict):
            raise UpstreamError(f"{method} {path}: HTTP {response.status}: {_message(doc, raw)}")
        return doc


def _tokens(value: object) -> np.ndarray:
    if not isinstance(value, list) or not all(type(t) is int for t in value):
        raise UpstreamError("/tokenize gave no list of token ids")
    return np.asarray(value, np.int64)


def _message(doc: object, raw: bytes) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return str(doc["error"].get("message", doc["error"]))
    return raw[:200].decode(errors="replace")
