"""Assembling and running the proxy: its configuration, the server's identity, the web app.

:func:`serve` runs until SIGINT or SIGTERM. It starts llama-server itself
(``ProxyConfig.upstream`` None) or fronts one that runs, reads the server's
``/props`` each time it is ready, and from them and the model file derives
the keys its states are filed under (``identity``). It listens only once
the server is ready, so a client never reaches a proxy that cannot answer.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ...errors import InvalidArgument
from . import identity
from .exchange import SlotExchange, check_private
from .proxy import Proxy
from .slots import SlotTable
from .store import Problems, StateStore
from .supervisor import RESERVED_OPTIONS, ServerProcess, find_server
from .upstream import Upstream, UpstreamError

log = logging.getLogger("kvcache.llama_server")

MAX_BODY_BYTES = 256 << 20
"""Largest request body relayed (aiohttp's default, 1 MiB, is below a long prompt's)."""


@dataclass(frozen=True)
class ProxyConfig:
    """What ``cortex cache llama-server`` was asked to do.

    Attributes:
        pool: the pool states are kept in.
        host, port: where clients reach the proxy.
        server_args: llama-server's options: the proxy starts it with them, or,
            with ``upstream``, they name the running server's settings in the keys.
        upstream: a running server's URL; None to start one.
        slot_dir: that server's ``--slot-save-path`` (needed with ``upstream``).
        server_bin: the llama-server to start (default: beside Python, or on PATH).
        model: the GGUF file, where ``/props``' model path is not readable here.
        chunk_tokens: tokens between prefix markers.
        max_waiting: requests that may wait for a slot at once.
    """

    pool: str
    host: str = "127.0.0.1"
    port: int = 8081
    server_args: tuple[str, ...] = ()
    upstream: str | None = None
    slot_dir: Path | None = None
    server_bin: str | None = None
    model: str | None = None
    chunk_tokens: int = 256
    max_waiting: int = 64

    def __post_init__(self) -> None:
        if (self.upstream is None) != (self.slot_dir is None):
            raise InvalidArgument("--upstream and --slot-dir go together (the server's own)")
        if self.upstream is None and not self.server_args:
            raise InvalidArgument("give llama-server's options after --, or --upstream URL")
        reserved = {arg.partition("=")[0] for arg in self.server_args} & RESERVED_OPTIONS
        if self.upstream is None and reserved:
            raise InvalidArgument(
                f"leave {', '.join(sorted(reserved))} to the proxy: "
                "clients use its --listen address"
            )
        if self.chunk_tokens < 1 or self.max_waiting < 0:
            raise InvalidArgument("--chunk-tokens must be at least 1, --max-waiting at least 0")


class _Service:
    """The parts of one running proxy, and the steps that join them."""

    def __init__(self, config: ProxyConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.problems = Problems()
        self.proxy: Proxy | None = None
        self.attached = asyncio.Event()
        self.server: ServerProcess | None = None
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        if config.upstream is not None and config.slot_dir is not None:  # both or neither
            self.slot_dir = check_private(config.slot_dir)
            self.upstream = Upstream(config.upstream, session)
        else:
            shm = Path("/dev/shm")
            self._temporary = tempfile.TemporaryDirectory(
                prefix="kvcache-llama-slots-", dir=shm if shm.is_dir() else None
            )  # mode 0700: mkdtemp's
            self.slot_dir = Path(self._temporary.name)
            binary = find_server(config.server_bin)
            self.server = ServerProcess(
                binary, config.server_args, self.slot_dir, self.attach, self.detach
            )
            self.upstream = Upstream(self.server.url, session)

    async def attach(self) -> None:
        """Read the (re)started server's props; key states by them; forget what slots held."""
        props = await self.upstream.props()
        num_slots = props.get("total_slots")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise UpstreamError(f"/props gave no slot count ({num_slots!r})")
        if self.proxy is None:
            self.proxy = Proxy(self.upstream, SlotTable(num_slots, self.config.max_waiting),
                               self.problems)  # fmt: skip
        self.proxy.slots.forget()
        old = self.proxy.exchange
        self.proxy.exchange = await self._exchange(props)
        if old is not None:
            old.store.close()
        self.proxy.ready.set()
        self.attached.set()

    def detach(self) -> None:
        """The server went down: requests wait for it."""
        if self.proxy is not None:
            self.proxy.ready.clear()

    async def _exchange(self, props: dict[str, object]) -> SlotExchange | None:
        config = self.config
        model_path = config.model or props.get("model_path")
        try:
            model = await asyncio.to_thread(identity.model_digest, str(model_path))
        except (OSError, TypeError) as exc:
            self.problems.note("pool_unavailable", f"the model file cannot be read: {exc}")
            return None
        settings = identity.server_settings(config.server_args) if config.server_args else None
        layout = identity.layout(props, settings)
        store = StateStore(
            config.pool, model, layout, chunk_tokens=config.chunk_tokens, problems=self.problems
        )
        self.problems.pool_sink = store.count_error
        log.info("model %s, %d settings in the keys", model, len(layout.settings))
        return SlotExchange(store, self.upstream, self.slot_dir, self.problems)

    def close(self) -> None:
        if self.proxy is not None and self.proxy.exchange is not None:
            self.proxy.exchange.store.close()
        if self._temporary is not None:
            self._temporary.cleanup()


async def serve(config: ProxyConfig, on_listening: Callable[[str], None] | None = None) -> None:
    """Run the proxy until SIGINT or SIGTERM.

    Raises:
        InvalidArgument: a bad configuration, or no llama-server to start.
        UpstreamError: the server to front does not answer ``/props``.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    connector = aiohttp.TCPConnector(limit=0)  # slots and max_waiting bound what is in flight
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        service = _Service(config, session)
        runner: web.AppRunner | None = None
        supervise: asyncio.Task[None] | None = None
        try:
            if service.server is not None:
                supervise = asyncio.create_task(service.server.run(session))
                await _first(service.attached.wait(), supervise, stop)
            else:
                await service.attach()
            if service.proxy is None:
                return  # stopped before the server was ready
            runner = web.AppRunner(_web_app(service.proxy, service.server), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, config.host, config.port).start()
            log.info("listening on http://%s:%d", config.host, config.port)
            if on_listening is not None:
                on_listening(f"http://{config.host}:{config.port}")
            await _first(stop.wait(), supervise, stop)
        finally:
            if runner is not None:
                await runner.cleanup()
            if service.proxy is not None:
                await service.proxy.drain()
            if service.server is not None:
                await service.server.stop()
            if supervise is not None:
                await asyncio.gather(supervise, return_exceptions=True)
            service.close()


async def _first(
    wait: Coroutine[Any, Any, object], supervise: asyncio.Task[None] | None, stop: asyncio.Event
) -> None:
    """Until ``wait`` is done, or ``stop``; a supervisor that fails raises its error here."""
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(wait)}
    waits.add(asyncio.ensure_future(stop.wait()))
    if supervise is not None:
        waits.add(supervise)
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending - {supervise}:
        task.cancel()
    if supervise is not None and supervise in done:
        supervise.result()


def _web_app(proxy: Proxy, server: ServerProcess | None) -> web.Application:
    async def stats(_: web.Request) -> web.Response:
        pid = None if server is None else server.pid
        return web.json_response({**proxy.stats(), "server_pid": pid})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/kvcache/stats", stats)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app
