"""Request traces to replay: the Mooncake JSONL format, read into flat arrays.

One JSON object per line (blank lines are skipped)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}

``hash_ids`` are the prompt's KV blocks in order (one per ``block_tokens``
tokens, 512 in Mooncake's traces); an id names the whole prefix up to the end
of its block, as a chained prefix key does. ``input_length`` (default: the
blocks' tokens) and ``timestamp`` (milliseconds, default 0) are optional;
other fields are ignored.

kvcache's own access log (``kvcache.accesslog``) is read too: its retrieve
lines are requests in this format, its store lines (``"op": "store"``) are
skipped, and its ``block_tokens`` (the prefix cache's chunk size) is the
trace's block size unless the caller names one (and its ``block_bytes`` the
bytes a block takes in a pool, for capacities given as sizes).

A trace of millions of block reads is kept as numpy arrays, not Python
objects: ``blocks`` holds every request's ids end to end and ``starts`` where
each request begins.

A trace is data from elsewhere, so reading one is bounded: only a regular
file is read (a FIFO, a device such as ``/dev/zero`` or a folder is refused
at once, without blocking: opened ``O_NONBLOCK``, then ``fstat``), unless the
path is ``-`` for stdin, which the caller chose; a line is at most
``MAX_LINE_BYTES`` (read with that limit, so a huge line is refused after
reading the limit, never parsed) and nests at most ``MAX_NESTING`` levels
(checked before ``json.loads``, whose recursion would otherwise end in a
``RecursionError``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import InvalidArgument
from ..safepath import UnsafePathError, open_given

MOONCAKE_BLOCK_TOKENS = 512
MAX_BLOCK_ID = (1 << 64) - 1
MAX_LINE_BYTES = 4 << 20
"""A request line holds one prompt's block ids: a million-token prompt in 16-token
chunks is 65,536 ids of at most 20 digits, about 1.4 MB. A longer line is not a
request, and 4 MiB of ids would already parse for about a second."""
MAX_NESTING = 32
"""A request nests 2 levels (an object holding a list); other fields are ignored but
must still parse, and 32 levels leave room for any sane one."""
STDIN = "-"


class TraceError(InvalidArgument):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order; request ``i`` reads ``blocks[starts[i]:starts[i + 1]]``."""

    name: str
    blocks: np.ndarray  # uint64 block ids, all requests end to end
    starts: np.ndarray  # int64, num_requests + 1 offsets into blocks
    input_tokens: np.ndarray  # int64 prompt length per request
    timestamps_ms: np.ndarray  # float64 arrival time per request
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    block_bytes: int | None = None  # an access log's bytes per block (chunk), if it says

    @property
    def num_requests(self) -> int:
        return int(self.starts.size - 1)

    @property
    def num_reads(self) -> int:
        return int(self.blocks.size)

    @cached_property
    def num_distinct(self) -> int:
        return int(np.unique(self.blocks).size)

    def request(self, i: int) -> np.ndarray:
        """Request ``i``'s block ids, in prompt order."""
        return self.blocks[self.starts[i] : self.starts[i + 1]]

    def head(self, num_requests: int) -> Trace:
        """The first ``num_requests`` requests."""
        n = min(num_requests, self.num_requests)
        return Trace(
            self.name,
            self.blocks[: self.starts[n]],
            self.starts[: n + 1],
            self.input_tokens[:n],
            self.timestamps_ms[:n],
            self.block_tokens,
            self.block_bytes,
        )


def read_trace(path: str | os.PathLike[str], block_tokens: int | None = None) -> Trace:
    """Read a Mooncake JSONL trace, or a kvcache access log.

    Args:
        path: the file, or ``-`` for stdin.
        block_tokens: tokens per block; default the trace's own (an access
            log's ``block_tokens``), else Mooncake's 512.

    Raises:
        TraceError: no such file, not a regular file, a line that is not a
            request (or too long or too deeply nested to be one), an access
            log of several chunk sizes, or no requests.
    """
    path = Path(path)
    shown = "stdin" if str(path) == STDIN else str(path)
    blocks: list[int] = []
    starts = [0]
    input_tokens: list[int] = []
    timestamps: list[float] = []
    requests: list[tuple[list[int], int | None, float]] = []
    sizes: set[int] = set()
    block_bytes: set[int] = set()
    for where, line in _lines(path, shown):
        request = _parse_request(line, where, sizes, block_bytes)
        if request is not None:
            requests.append(request)
    if block_tokens is None:
        if len(sizes) > 1:
            raise TraceError(
                f"{shown} logs chunks of {sorted(sizes)} tokens: simulate one prefix cache's "
                "requests at a time (give --block-tokens to replay them as one size)"
            )
        block_tokens = sizes.pop() if sizes else MOONCAKE_BLOCK_TOKENS
    for ids, tokens, timestamp in requests:
        blocks += ids
        starts.append(len(blocks))
        input_tokens.append(len(ids) * block_tokens if tokens is None else tokens)
        timestamps.append(timestamp)
    if not input_tokens:
        raise TraceError(
            f"{shown} holds no requests: a trace has one JSON object per line with 'hash_ids'"
        )
    return Trace(
        Path(shown).name,
        np.array(blocks, dtype=np.uint64),
        np.array(starts, dtype=np.int64),
        np.array(input_tokens, dtype=np.int64),
        np.array(timestamps, dtype=np.float64),
        block_tokens,
        block_bytes.pop() if len(block_bytes) == 1 else None,
    )


def _lines(path: Path, shown: str) -> Iterator[tuple[str, bytes]]:
    """Each non-blank line of the trace with where it is (``FILE line N``), each checked
    against ``MAX_LINE_BYTES`` and ``MAX_NESTING``."""
    reading_stdin = str(path) == STDIN
    stream = sys.stdin.buffer if reading_stdin else _open_regular(path)
    with contextlib.nullcontext(stream) if reading_stdin else stream:  # stdin stays open
        number = 0
        while line := stream.readline(MAX_LINE_BYTES + 1):
            number += 1
            where = f"{shown} line {number}"
            if len(line) > MAX_LINE_BYTES:
                raise TraceError(
                    f"{where} is longer than {MAX_LINE_BYTES >> 20} MiB: a request is one "
                    "prompt's block ids; is this a trace (one JSON object per line)?"
                )
            if line.strip():
                _check_nesting(line, where)
                yield where, line


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file reached through folders no
    other user controls (:mod:`kvcache.safepath`); a FIFO or a device is refused without
    waiting for a writer or reading a byte.

    Raises:
        TraceError: no such file, unreadable, not a regular file, or a path through a
            folder or symlink another user could have changed.
    """
    try:
        fd = open_given(path, any_owner=True, what="trace")
    except UnsafePathError as exc:
        raise TraceError(f"{exc}, or {STDIN} to read one from stdin") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
"""A JSON string, whose brackets are not nesting."""
_OPENING = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSING = np.frombuffer(b"]}", dtype=np.uint8)


def _check_nesting(line: bytes, where: str) -> None:
    """Refuse a line nested deeper than ``MAX_NESTING``; a line with fewer brackets than
    that (every request) is passed by two ``count``s, without a scan."""
    if line.count(b"[") + line.count(b"{") <= MAX_NESTING:
        return
    structure = np.frombuffer(_STRING.sub(b"", line), dtype=np.uint8)
    steps = np.isin(structure, _OPENING).astype(np.int32) - np.isin(structure, _CLOSING)
    if steps.size and int(np.cumsum(steps).max()) > MAX_NESTING:
        raise TraceError(
            f"{where}: nested more than {MAX_NESTING} levels deep; a request is a JSON "
            "object with a list of block ids"
        )


def _parse_request(
    line: bytes, where: str, sizes: set[int], block_bytes: set[int]
) -> tuple[list[int], int | None, float] | None:
    """A request's (block ids, prompt tokens or None, timestamp); None for an access log's
    store line. Adds an access log's chunk size to ``sizes``, its bytes to ``block_bytes``."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise TraceError(
            f"{where}: not JSON; a trace has one JSON object per line (Mooncake format)"
        ) from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: not a JSON object with 'hash_ids'")
    if record.get("op") == "store":
        return None
    ids = record.get("hash_ids")
    if ids is None:
        raise TraceError(f"{where}: missing field 'hash_ids' (the prompt's block ids)")
    if not isinstance(ids, list) or not all(_is_block_id(i) for i in ids):
        raise TraceError(f"{where}: 'hash_ids' must be a list of whole numbers 0 to 2**64-1")
    tokens = record.get("input_length")
    if tokens is not None and not _is_count(tokens):
        raise TraceError(f"{where}: 'input_length' must be a whole number of tokens, 0 or more")
    timestamp = record.get("timestamp", 0)
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise TraceError(f"{where}: 'timestamp' must be a number of milliseconds")
    size = record.get("block_tokens")
    if size is not None:
        if not _is_count(size) or size == 0:
            raise TraceError(f"{where}: 'block_tokens' must be a whole number of tokens, 1 or more")
        sizes.add(size)
    size_bytes = record.get("block_bytes")
    if size_bytes is not None:
        if not _is_count(size_bytes) or size_bytes == 0:
            raise TraceError(f"{where}: 'block_bytes' must be a whole number of bytes, 1 or more")
        block_bytes.add(size_bytes)
    return ids, tokens, float(timestamp)


def _is_block_id(value: object) -> bool:
    return _is_count(value) and value <= MAX_BLOCK_ID  # type: ignore[operator]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
