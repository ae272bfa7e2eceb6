"""Moving bytes between callers' buffers and an entry's pages.

An entry's bytes (``key | value header | payload``) lie over its page chain,
which ``Table.extents`` gives as extents of the data region, one per run of
adjacent pages (``PageAllocator.runs``), or as its one inline slot; each extent
is one ``memoryview`` slice of the data region, so a value is copied with one
``memcpy`` per extent (one in total when its pages are adjacent, as they are in
a fresh pool) and never through an intermediate buffer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import numpy as np
import xxhash

from . import codec, native
from .errors import corrupt

Extent = tuple[int, int]
"""(offset in the data region, length) of bytes that lie together."""


def spans(extents: list[Extent], start: int, length: int) -> list[Extent]:
    """The extents of bytes ``[start, start+length)`` of an entry laid over ``extents``.

    Raises:
        CorruptPoolError: a negative start or length, or bytes past the extents
            (damaged lengths): a slice with a negative bound would wrap around to the
            end of the pool, and one past it would quietly come back short.
    """
    if start < 0 or length < 0:
        raise corrupt("an entry's lengths are damaged")
    pieces: list[Extent] = []
    for offset, extent_bytes in extents:
        if start >= extent_bytes:
            start -= extent_bytes
            continue
        take = min(length, extent_bytes - start)
        pieces.append((offset + start, take))
        length -= take
        start = 0
        if not length:
            break
    if length:
        raise corrupt("an entry's lengths are past its pages")
    return pieces


def slices(data: memoryview, extents: list[Extent], start: int, length: int) -> list[memoryview]:
    """Views of bytes ``[start, start+length)`` of an entry laid over ``extents``."""
    return [data[offset : offset + n] for offset, n in spans(extents, start, length)]


class Payload:
    """A value's bytes in a pool: views of the mapping, and for a disk pool's large
    values where they lie in its file, so that they are read with ``preadv``.

    Measured on this machine's disk, cold, 1 and 16 MiB values: ``preadv``
    1.9-2.5 GB/s, copying out of the mapping 0.8-1.3 GB/s even with the
    read-ahead advice (the mapping faults pages in a few at a time). ``landed``
    holds the bytes the last copy delivered, so that the checksum is computed
    over what the caller got: for a disk read, bytes already in the CPU cache
    rather than a second pass over the file.
    """

    __slots__ = ("digest", "fd", "file_spans", "landed", "summed_first", "views")

    def __init__(
        self, views: list[memoryview], fd: int = -1, file_spans: Sequence[tuple[int, int]] = ()
    ) -> None:
        self.views = views
        self.fd = fd  # -1: copied through the mapping
        self.file_spans = file_spans  # (offset in the file, length) of each view
        self.landed: list[memoryview] = views
        # set by a verifying reader: what the checksum covers before the payload (its
        # fields and the key and codec header); ``copy_into`` then sums as it copies
        self.summed_first: list[bytes | memoryview] | None = None
        self.digest: int | None = None  # the checksum that copy summed, if it did

    @property
    def nbytes(self) -> int:
        return sum(len(view) for view in self.views)

    def join(self) -> bytes:
        """The bytes as one ``bytes`` (summed as they are copied, for a verifying reader)."""
        if self.fd < 0:
            if self.summed_first is not None and native.sum_and_join is not None:
                self.digest, joined = native.sum_and_join(self.summed_first, self.views)
                return joined
            return b"".join(self.views)
        parts = [pread_exactly(self.fd, n, offset) for offset, n in self.file_spans]
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        self.landed = [memoryview(joined)]
        return joined

    def copy_into(self, target: memoryview) -> None:
        """Copy the bytes to the start of ``target``, which is at least as long."""
        if self.fd < 0:
            if self.summed_first is not None and native.sum_and_copy is not None:
                self.digest = native.sum_and_copy(self.summed_first, self.views, (target,))
            else:
                copy_into(target, self.views)
            return
        position = 0
        for offset, n in self.file_spans:
            end = position + n
            read_exactly(self.fd, target[position:end], offset)
            position = end
        self.landed = [target[:position]]


def pread_exactly(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes of ``fd`` at ``offset``, as a new ``bytes`` (one copy).

    Raises:
        CorruptPoolError: the file ends first (a truncated pool file).
    """
    got = os.pread(fd, length, offset)
    if len(got) < length:  # a regular file returns it all, short of its end
        rest = bytearray(got)
        rest += os.pread(fd, length - len(got), offset + len(got))
        if len(rest) < length:
            raise corrupt("the pool's file is shorter than its pages (truncated?)")
        return bytes(rest)
    return got


def read_exactly(fd: int, target: memoryview, offset: int) -> None:
    """Fill ``target`` from ``fd`` at ``offset``.

    Raises:
        CorruptPoolError: the file ends first (a truncated pool file).
    """
    done = 0
    while done < len(target):
        got = os.preadv(fd, [target[done:]], offset + done)
        if not got:
            raise corrupt("the pool's file is shorter than its pages (truncated?)")
        done += got


def scatter(targets: list[memoryview], pieces: tuple[bytes | memoryview, ...]) -> None:
    """Copy ``pieces`` back to back into ``targets``, windows at least as long in total."""
    if native.copy is not None:
        native.copy(pieces, targets)
        return
    if len(targets) == 1:  # adjacent pages (always, for values of one page): plain slices
        window, offset = targets[0], 0
        for piece in pieces:
            end = offset + len(piece)
            window[offset:end] = piece
            offset = end
        return
    windows = iter(targets)
    window, filled = next(windows), 0
    for piece in pieces:
        done, size = 0, len(piece)
        while done < size:
            if filled == len(window):
                window, filled = next(windows), 0
            take = min(size - done, len(window) - filled)
            window[filled : filled + take] = piece[done : done + take]
            filled += take
            done += take


UNLOCKED_COPY_BYTES = 1 << 20
"""From this size up a piece is copied by numpy, which lets other threads run meanwhile
(a memoryview assignment holds the GIL): ``prefix.fetch`` copies chunks in parallel.
(``native.copy``, where it is built, lets them run from 64 KiB up.)"""


def copy_into(target: memoryview, sources: list[memoryview]) -> None:
    """Copy ``sources`` back to back into the start of ``target``."""
    if native.copy is not None:
        native.copy(sources, (target,))
        return
    offset = 0
    for source in sources:
        end = offset + len(source)
        if len(source) >= UNLOCKED_COPY_BYTES:
            np.copyto(
                np.frombuffer(target, np.uint8, len(source), offset),
                np.frombuffer(source, np.uint8),
            )
        else:
            target[offset:end] = source
        offset = end


def materialise(header: bytes, payload: Payload) -> bytes | np.ndarray:
    """Copy the payload out as ``bytes``, or as the array ``header`` describes."""
    if not header:
        return payload.join()
    array = codec.new_array(header, payload.nbytes)
    payload.copy_into(codec.byte_view(array))
    return array


RECORD_FIELDS = struct.Struct("<4q")
"""The record fields that say how an entry's bytes are read (flags, key_len,
header_len, value_len), packed as the checksum covers them: 32 bytes."""


def checksum(
    views: Sequence[bytes | memoryview], flags: int, key_len: int, header_len: int, value_len: int
) -> int:
    """xxh3-64 of an entry: its read fields, then its bytes (``key | value header | payload``).

    The fields are covered because they decide how the bytes are read back: a
    changed ``value_len`` (within the same pages) would return a shorter value,
    a flipped ``KEY_IS_STR`` a bytes key for a text one. Hashing the 32-byte
    struct in the same digest costs ~0.07 us per entry (measured), nothing
    beside the bytes. The same sum guards an entry in the pool and in a
    snapshot, so persist writes the pool's sum as it is and a damaged entry
    stays detectably damaged. xxh3 runs at several times memcpy speed (see the
    docs/performance.md).
    """
    digest = xxhash.xxh3_64(RECORD_FIELDS.pack(flags, key_len, header_len, value_len))
    for view in views:
        digest.update(view)
    return digest.intdigest()


def scatter_summed(
    targets: list[memoryview],
    pieces: tuple[bytes | memoryview, ...],
    fields: tuple[int, int, int, int],
) -> int:
    """:func:`scatter` ``pieces`` into ``targets`` and return their :func:`checksum` (with
    ``fields``: flags, key_len, header_len, value_len).

    Compiled, it is one pass at any size, so the caller's bytes are read from
    memory once, and from 64 KiB up the copy goes round the cache
    (``native.sum_and_stream``), so the pool's pages are not read first.
    """
    if native.sum_and_stream is None:
        digest = checksum(pieces, *fields)
        scatter(targets, pieces)
        return digest
    return native.sum_and_stream((RECORD_FIELDS.pack(*fields),), pieces, targets)


def as_word(value: int) -> int:
    """An unsigned 64-bit value as the signed word a record field holds."""
    return value - (1 << 64) if value >= 1 << 63 else value


def from_word(word: int) -> int:
    """The unsigned 64-bit value a record's signed word holds."""
    return word & ((1 << 64) - 1)
