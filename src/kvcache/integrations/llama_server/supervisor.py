"""Running llama-server under the proxy: started with a private slot folder, restarted if it dies.

The server listens on a free loopback port that only the proxy talks to, with
``--slot-save-path`` on the proxy's private folder. Each time it answers
``/health`` (model loaded) the proxy is told (``on_ready``: read its props
again, forget what slots held); while it is down, requests wait for it. A
server that dies is started again after a pause that doubles up to a minute,
so a model that cannot load does not spin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp

from ...deathsig import die_with_parent
from ...errors import InvalidArgument

log = logging.getLogger("kvcache.llama_server")

PROMPT_CACHE_OPTIONS = frozenset(
    {"--cache-idle-slots", "--no-cache-idle-slots", "-cram", "--cache-ram"}
)
"""Without any of these the server runs with ``--cache-ram 0``: its own RAM prompt cache
(8 GiB by default) holds what the pool holds, and costs more than it gives here. With it, a
request after a restore took 520-630 ms for one new token on the quick benchmark model
(1-2 ms without); and with a unified KV (``-kvu``) it clears every idle slot each time a
task starts -- a state the proxy has just restored, before its request starts, too (4
restores in 6 lost that way with 3 slots and 6 clients)."""
RESERVED_OPTIONS = frozenset(
    {"--host", "--port", "--slot-save-path", "--api-key", "--api-key-file"}
)
"""Options the proxy sets itself (the server is the proxy's private backend)."""
READY_TIMEOUT_S = 600.0
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 1.0, 60.0


def find_server(binary: str | None) -> str:
    """The llama-server to run: ``binary``, else the one beside this Python, else on PATH.

    Raises:
        InvalidArgument: none found.
    """
    if binary is not None:
        found = shutil.which(binary)
        if found is None:
            raise InvalidArgument(f"no llama-server at {binary}")
        return found
    beside = Path(sys.executable).parent / "llama-server"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("llama-server")
    if found is None:
        raise InvalidArgument(
            "no llama-server found beside Python or on PATH: pass --server-bin PATH "
            "(scripts/setup.sh builds one into .venv/bin)"
        )
    return found


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM when the proxy dies, however it dies, so a
    killed proxy leaves no server holding its memory and port."""
    die_with_parent(signal.SIGTERM)


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One llama-server, kept running until :meth:`stop`.

    Args:
        binary: the llama-server executable.
        args: the user's options (no host, port, slot folder or API key:
            ``ProxyConfig`` refuses them).
        slot_dir: the private slot folder.
        on_ready: called (awaited) each time a started server answers ``/health``.
        on_down: called each time the server exits (requests then wait).
    """

    def __init__(
        self,
        binary: str,
        args: Sequence[str],
        slot_dir: Path,
        on_ready: Callable[[], Awaitable[None]],
        on_down: Callable[[], None],
    ) -> None:
        self.binary = binary
        self.args = list(args)
        self.slot_dir = slot_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._on_ready = on_ready
        self._on_down = on_down
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The running server's process id (None between runs)."""
        return None if self._process is None else self._process.pid

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Start the server and start it again whenever it exits, until :meth:`stop`."""
        pause = _FIRST_PAUSE_S
        while not self._stopping:
            command = [self.binary, *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
            command += ["--slot-save-path", str(self.slot_dir)]
            if not {arg.partition("=")[0] for arg in self.args} & PROMPT_CACHE_OPTIONS:
                command += ["--cache-ram", "0"]
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, preexec_fn=_end_with_parent
            )
            self._process = process
            log.info("started llama-server (pid %d) on %s", process.pid, self.url)
            if await self._healthy(session, process):
                await self._on_ready()
                pause = _FIRST_PAUSE_S
            elif process.returncode is None:
                log.error("llama-server did not answer /health in %.0f s", READY_TIMEOUT_S)
                process.kill()
            code = await process.wait()
            self._on_down()
            if self._stopping:
                return
            log.warning("llama-server exited (status %s); starting it again in %.0f s", code, pause)
            await asyncio.sleep(pause)
            pause = min(2 * pause, _LONGEST_PAUSE_S)

    async def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and do not start it again."""
        self._stopping = True
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()

    async def _healthy(
        self, session: aiohttp.ClientSession, process: asyncio.subprocess.Process
    ) -> bool:
        """Wait until the server answers /health with 200; False if it exits first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while process.returncode is None and loop.time() < deadline:
            try:
                async with session.get(f"{self.url}/health") as answer:
                    if answer.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        return False
