"""The proxy's handling of one completion request: tokens, a slot, a restore, a save.

::

    client --> tokens (as given, or the server's /apply-template and /tokenize)
           --> a slot lent by the SlotTable (the one already holding the most of them)
           --> the pool's longest stored prefix, restored into that slot if it beats
               what the slot holds
           --> the request, pinned: id_slot = slot, cache_prompt = true
           <-- the server's answer, relayed byte for byte as it streams
           --> cache_n checked against what the slot held (a shortfall is counted)
           --> in the background: the slot saved into the pool, keyed at every
               chunk boundary of its tokens; then the slot is lent again

Requests whose tokens cannot be known (several prompts, a client's own
``id_slot``, ``cache_prompt: false``) go through unchanged; so does any other
path. Nothing on the cache's side fails a request (see ``store``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any

import numpy as np
from aiohttp import web

from ...prefix.states import shared_prefix
from .exchange import SlotExchange
from .forward import CacheWatch, Unreachable, error_response, forward
from .slots import SlotTable
from .store import Problems
from .upstream import Upstream, UpstreamError

log = logging.getLogger("kvcache.llama_server")

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
COMPLETION_PATHS = frozenset({"/completion", "/completions", "/v1/completions"})
READY_WAIT_S = 300.0
"""How long a request waits for a (re)starting server before it is answered 503."""


class Proxy:
    """Caches llama-server's slots in a pool around the requests it relays.

    Args:
        upstream: the server.
        slots: its slots.
        problems: where cache problems are counted.
    """

    def __init__(self, upstream: Upstream, slots: SlotTable, problems: Problems) -> None:
        self.upstream = upstream
        self.slots = slots
        self.problems = problems
        self.exchange: SlotExchange | None = None  # None: not caching (no pool, no identity)
        self.ready = asyncio.Event()
        self.counts: Counter[str] = Counter()
        self._saves: set[asyncio.Task[None]] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Relay any request; completions are cached on the way."""
        body = await request.read()
        if not await self._wait_ready():
            return error_response(503, "llama-server is not ready (see the proxy's log)")
        path = request.path
        if request.method != "POST" or path not in CHAT_PATHS | COMPLETION_PATHS:
            if request.method == "POST" and path.startswith("/slots"):
                self.slots.forget()  # a client's own slot actions change what slots hold
            return await self._relay(request, body)
        doc = _json_object(body)
        if doc is None or doc.get("id_slot", -1) != -1:
            self.slots.forget()
            return await self._relay(request, body)
        return await self._complete(request, body, doc)

    async def _complete(
        self, request: web.Request, body: bytes, doc: dict[str, Any]
    ) -> web.StreamResponse:
        self.counts["requests"] += 1
        tokens = await self._tokens(request.path, doc) if doc.get("cache_prompt", True) else None
        slot = await self.slots.acquire(tokens if tokens is not None else np.zeros(0, np.int64))
        if slot is None:
            self.problems.note("busy", f"{self.slots.num_waiting} requests waiting")
            try:
                return await self._relay(request, body)
            finally:
                self.slots.forget()
        saving = False
        try:
            held, restored = self.slots.held(slot), False
            if tokens is not None and self.exchange is not None:
                put = await self.exchange.restore(slot, tokens, held)
                if put is not None:
                    held, restored = put.tokens, put.num_shared > 0
                    self.counts["restored"] += restored
            pinned = {**doc, "id_slot": slot}
            if tokens is not None:
                pinned["cache_prompt"] = True
            watch = CacheWatch()
            response = await self._relay(request, _encode(pinned), watch)
            if response.status == 200 and not watch.complete:
                self.counts["incomplete"] += 1  # the client left: what the slot holds is unsure
            elif tokens is not None and response.status == 200:
                self._check(watch.cache_n(), held, tokens, restored)
                saving = self._save_later(slot)
            return response
        finally:
            if not saving:
                self.slots.release(slot, None)

    async def _relay(
        self, request: web.Request, body: bytes, watch: CacheWatch | None = None
    ) -> web.StreamResponse:
        """Forward a request; one the server never took is sent again once it is back.

        A server killed or restarting refuses connections until the supervisor
        has it up again; a request must not fail for that (nor for a save that
        was running when it died).
        """
        deadline = asyncio.get_running_loop().time() + READY_WAIT_S
        while True:
            try:
                return await forward(request, self.upstream, body, watch)
            except Unreachable as exc:
                late = asyncio.get_running_loop().time() > deadline
                if late or not await self._wait_ready(exc):
                    return error_response(502, f"llama-server is not reachable: {exc}")

    async def _wait_ready(self, failure: Exception | None = None) -> bool:
        """Wait until the server is (back) up; False after ``READY_WAIT_S``.

        After a ``failure`` the server may not yet be seen down: wait a moment first.
        """
        if failure is not None:
            self.counts["resent"] += 1
            log.info("llama-server did not take a request (%s); waiting for it", failure)
            await asyncio.sleep(0.2)
        try:
            await asyncio.wait_for(self.ready.wait(), READY_WAIT_S)
        except asyncio.TimeoutError:
            return False
        return True

    async def _tokens(self, path: str, doc: dict[str, Any]) -> np.ndarray | None:
        """The request's prompt tokens as the server will see them; None if not one prompt."""
        prompt = doc.get("prompt")
        try:
            if path in CHAT_PATHS:
                if not isinstance(doc.get("messages"), list):
                    return None
                text = await self.upstream.apply_template(doc)
            elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return np.asarray(prompt, np.int64)  # token ids are used as given (no BOS added)
            elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                text = prompt[0]
            elif isinstance(prompt, str):
                text = prompt
            else:
                return None
            tokens = await self.upstream.tokenize(text)
        except UpstreamError as exc:
            self.problems.note("tokenize_failed", exc)
            return None
        return tokens if len(tokens) else None

    def _check(
        self, cache_n: int | None, held: np.ndarray, tokens: np.ndarray, restored: bool
    ) -> None:
        """Count a request whose server reused fewer tokens than its slot held for it.

        The server evaluates at least a prompt's last token, hence the ``- 1``.
        """
        expected = min(shared_prefix(held, tokens), len(tokens) - 1)
        if cache_n is None:
            return
        self.counts["tokens_reused"] += cache_n
        if cache_n < expected:
            kind = "restore_ineffective" if restored else "stale_slot"
            self.problems.note(kind, f"cache_n {cache_n}, expected {expected}")

    def _save_later(self, slot: int) -> bool:
        """Save ``slot`` into the pool in the background, then lend it again."""
        exchange = self.exchange
        if exchange is None:
            return False

        async def save() -> None:
            held = None
            try:
                held = await exchange.save(slot)
                self.counts["saved"] += held is not None
            finally:
                self.slots.release(slot, held)

        task = asyncio.create_task(save())
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)
        return True

    async def drain(self) -> None:
        """Wait for the saves still running (at shutdown)."""
        if self._saves:
            await asyncio.gather(*self._saves, return_exceptions=True)

    def stats(self) -> dict[str, object]:
        """What ``GET /kvcache/stats`` answers: requests, restores, saves and problems."""
        return {
            "caching": self.exchange is not None,
            "counts": dict(self.counts),
            "problems": dict(self.problems.counts),
            "slots": self.slots.num_slots,
            "waiting": self.slots.num_waiting,
        }


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode()
