"""``cortex cache llama-server``: run the llama-server proxy that caches slots in a pool."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from ..errors import InvalidArgument
from .output import Output


def llama_server(args: argparse.Namespace, out: Output) -> dict[str, object]:
    """Run the proxy until SIGINT or SIGTERM (its own log goes to stderr)."""
    # imported here: aiohttp is the llama-server extra's, not every command's
    from ..integrations.llama_server import ProxyConfig, serve

    host, port = listen_address(args.listen)
    server_args = list(args.server_args)
    if server_args[:1] == ["--"]:
        server_args = server_args[1:]
    config = ProxyConfig(
        pool=args.pool,
        host=host,
        port=port,
        server_args=tuple(server_args),
        upstream=args.upstream,
        slot_dir=None if args.slot_dir is None else Path(args.slot_dir),
        server_bin=args.server_bin,
        model=args.model,
        chunk_tokens=args.chunk_tokens,
        max_waiting=args.max_waiting,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(serve(config))
    return {}


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8081`` for IPv6) as a host and a port.

    Raises:
        InvalidArgument: not of that form.
    """
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"--listen must be HOST:PORT (e.g. 127.0.0.1:8081), not {text!r}")
    return host, int(port)
