"""Persist a pool to a file and restore it: warm restarts after a reboot.

- ``format``: the versioned binary layout and the validation of what is read.
- ``files``: default locations and crash-safe (temp + fsync + rename) writing.
- this module: ``persist``, ``restore`` and ``inspect_snapshot``.

Persisting never stops other processes for long: the lock is taken per entry,
only to find its pages and then to confirm that the entry did not change while
its bytes were written (the same seqlock readers use); an entry that changed
is left out. Restoring builds the new pool under a hidden name and swaps it in
only when it is complete, so a bad file never harms the pool it would replace;
the swap happens under the old pool's lock and marks it replaced, so processes
still attached to it fail their next call instead of storing into a file that
lost its name (and it is refused while there are any, unless forced).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import replace as replace_fields
from pathlib import Path

import numpy as np

from .. import folders, memory, owners, segment
from ..config import PoolConfig
from ..errors import (
    InvalidArgument,
    PoolExistsError,
    SnapshotError,
)
from ..layout import ENTRY_DTYPE
from ..lifecycle import create_from_config, discard, publish, refuse_if_in_use
from ..lifecycle import open as open_pool
from ..opening import Link, chain_of
from ..policies import ScoreContext, get_policy, rank_victims
from ..pool import Pool
from ..settings import write_settings
from ..stored import EntryRef, StoredEntry
from ..units import parse_size
from . import files
from .format import (
    HEADER_BYTES,
    RECORD_DTYPE,
    check_records,
    content_problem,
    decode_header,
    encode_header,
    entry_checksum,
    pool_checksum,
    record_problems,
)

_RECORD_FIELDS_FROM_ENTRY = (
    "key_len", "header_len", "value_len", "flags", "priority",
    "expires_at", "last_access", "created", "freq",
)  # fmt: skip
"""Snapshot record fields copied as they are from the pool's entry records."""

Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``, called as entries are written or read."""


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot holds, read from its header and entry table."""

    path: Path
    name: str
    config: PoolConfig
    mode: int  # the pool file's permission bits; restored unless restore(mode=) says otherwise
    num_entries: int
    data_bytes: int
    file_bytes: int
    created_at: float
    format_version: int

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return {
            "path": str(self.path),
            "name": self.name,
            "config": self.config.to_dict(),
            "mode": f"{self.mode:o}",
            "num_entries": self.num_entries,
            "data_bytes": self.data_bytes,
            "file_bytes": self.file_bytes,
            "created_at": self.created_at,
            "format_version": self.format_version,
        }


@dataclass(frozen=True)
class RestoreReport:
    """What a restore brought back and what it left out, and why."""

    num_restored: int
    num_expired: int  # expired while the pool was down
    num_dropped: int  # did not fit a smaller pool: the policy chose them to go
    skipped: list[str] = field(default_factory=list)  # damaged entries

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return {
            "num_restored": self.num_restored,
            "num_expired": self.num_expired,
            "num_dropped": self.num_dropped,
            "skipped": list(self.skipped),
        }


def persist(
    pool: Pool, path: str | os.PathLike[str] | None = None, progress: Progress | None = None
) -> Path:
    """Write ``pool``'s live entries to a snapshot file; return its path.

    Args:
        path: destination; default ``default_path(pool.name)``.
        progress: called with (bytes written, bytes to write).

    Raises:
        SnapshotError: the file cannot be written (the previous one is kept).
    """
    target = Path(path) if path is not None else files.default_path(pool.name)
    clock, ids, entries = pool.live_entries()
    mode = pool.mode
    total = int((entries["key_len"] + entries["header_len"] + entries["value_len"]).sum())
    created_at = time.time()

    def write(fd: int) -> None:
        os.lseek(fd, HEADER_BYTES, os.SEEK_SET)
        kept: list[int] = []  # indexes into ids/entries, in file order
        offsets: list[int] = []
        offset = 0
        for index, (eid, generation) in enumerate(
            zip(ids.tolist(), entries["generation"].tolist(), strict=True)
        ):
            ref = EntryRef(eid, generation)
            read = pool.read_entry(ref)
            if read is None:
                continue  # evicted or replaced since the table was read
            entry, views = read
            files.write_all(fd, views)
            if not pool.confirm(ref, entry, views):
                os.lseek(fd, HEADER_BYTES + offset, os.SEEK_SET)  # overwrite it with the next
                continue
            kept.append(index)
            offsets.append(offset)
            offset += sum(v.nbytes for v in views)
            if progress:
                progress(offset, total)
        os.ftruncate(fd, HEADER_BYTES + offset)
        records = np.zeros(len(kept), RECORD_DTYPE)
        for name in _RECORD_FIELDS_FROM_ENTRY:
            records[name] = entries[name][kept]
        records["offset"] = offsets
        # The pool's own sums, not new ones: an entry damaged in memory after it
        # was written stays detectably damaged in the file (restore skips it).
        records["checksum"] = entries["checksum"][kept].view(np.uint64)
        os.pwrite(fd, records.tobytes(), HEADER_BYTES + offset)
        os.pwrite(
            fd,
            encode_header(pool.name, pool.config, created_at, clock, records, offset, mode=mode),
            0,
        )

    files.write_atomically(target, write)
    return target


def inspect_snapshot(path: str | os.PathLike[str]) -> SnapshotInfo:
    """Read and verify a snapshot's header and entry table (not its data).

    Any user's snapshot is read: this restores nothing (``restore`` checks the owner).

    Raises:
        SnapshotError: missing, unreadable, foreign, future-version or damaged file.
    """
    with _Reader(Path(path), trust=None) as reader:
        header = reader.header
        return SnapshotInfo(
            path=reader.path,
            name=bytes(header["name"]).decode("utf-8", "replace"),
            config=reader.config,
            mode=reader.mode,
            num_entries=len(reader.records),
            data_bytes=int(header["data_bytes"]),
            file_bytes=reader.file_bytes,
            created_at=float(header["created_at"]),
            format_version=int(header["format_version"]),
        )


def restore(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    replace: bool = False,
    size: str | int | None = None,
    config: PoolConfig | None = None,
    mode: int | None = None,
    force: bool = False,
    prealloc: bool = False,
    progress: Progress | None = None,
    trust_owner: str | int | None = None,
    trust_group: bool = False,
    tier: str | None = None,
    folder: str | os.PathLike[str] | None = None,
) -> Pool:
    """Recreate pool ``name`` from a snapshot and open it (see :func:`restore_with_report`)."""
    pool, _ = restore_with_report(
        name,
        path,
        replace=replace,
        size=size,
        config=config,
        mode=mode,
        force=force,
        prealloc=prealloc,
        progress=progress,
        trust_owner=trust_owner,
        trust_group=trust_group,
        tier=tier,
        folder=folder,
    )
    return pool


def restore_with_report(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    replace: bool = False,
    size: str | int | None = None,
    config: PoolConfig | None = None,
    mode: int | None = None,
    force: bool = False,
    prealloc: bool = False,
    progress: Progress | None = None,
    trust_owner: str | int | None = None,
    trust_group: bool = False,
    tier: str | None = None,
    folder: str | os.PathLike[str] | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[Pool, RestoreReport]:
    """Recreate pool ``name`` from a snapshot, with the snapshot's configuration and mode.

    Args:
        path: the snapshot; default ``default_path(name)``.
        replace: replace an existing pool of that name (once the new one is
            complete); processes that have it open then fail their next call
            with ``PoolDestroyedError``. Its chain (``spill_to``) carries over.
        size: a different pool size; if smaller, the policy decides what stays.
        config: a whole new configuration instead of the snapshot's (``create
            --restore``: the pool its flags describe, filled from the snapshot);
            what does not fit is chosen by its policy. Not with ``size``.
        mode: file permissions; default the snapshot's (0600 if it recorded none).
        force: accept a mode that gives other users access (see :func:`kvcache.create`),
            and replace a pool that other processes have open.
        prealloc: reserve all memory now rather than as pages are first used.
        progress: called with (bytes read, bytes to read).
        trust_owner: accept a snapshot file (and a pool to replace) of this
            other user (see :func:`kvcache.open`); by default only the caller's
            own and root's are.
        trust_group: accept those whose group is one of the caller's.
        tier: where the new pool's file goes (see :func:`kvcache.create`'s
            ``tier``); default the tier of the pool it replaces, else cpu.
        folder: the folder for it (``kvcache.create``'s ``path``); default the
            folder of the disk pool it replaces, else shared memory.
        clock: wall clock, to leave out entries that expired meanwhile.

    Raises:
        SnapshotError: the file is missing, foreign, future-version, truncated or damaged.
        PoolExistsError: the pool exists and ``replace`` is False.
        PoolBusyError: ``replace`` of a pool other processes have open, without ``force``.
        UntrustedOwnerError: the snapshot or the pool belongs to another user.
        InvalidArgument: a bad size or mode, or both ``size`` and ``config``.
    """
    segment.validate_name(name)
    if size is not None and config is not None:
        raise InvalidArgument("give restore a size or a config, not both: the config has a size")
    source = Path(path) if path is not None else files.default_path(name)
    trust = {"trust_owner": trust_owner, "trust_group": trust_group}
    target = folders.for_restore(name, replace, tier, folder)
    if not replace and name in segment.list_names():
        raise PoolExistsError(
            f"pool '{name}' already exists: restore with replace=True, or destroy it first"
        )
    if replace and not force:
        refuse_if_in_use(name, **trust)  # now, rather than after reading the whole snapshot
    with _Reader(source, owners.Trust.build(trust_owner, trust_group)) as reader:
        mode = segment.check_mode(reader.mode if mode is None else mode, force=force)
        if config is None:
            config = reader.config
        if size is not None:
            config = replace_size(config, parse_size(size, what="pool size"))
        records = reader.records
        snapshot_clock = int(reader.header["clock"])
        bad = record_problems(records, snapshot_clock)
        nonsense = [_skipped(reader, index, why) for index, why in bad.items()]
        sound = np.ones(len(records), bool)
        sound[list(bad)] = False
        now = clock()
        alive = np.flatnonzero(sound & (records["expires_at"] > now))
        keep = _choose_survivors(records[alive], config, snapshot_clock, now)
        chosen = alive[keep]
        chosen = chosen[np.argsort(records["offset"][chosen], kind="stable")]  # read sequentially
        # Fail now rather than after filling most of the pool; each reservation
        # is checked again as it happens (memory may go to others meanwhile).
        memory.Room(target).require(
            int(_pages(records[chosen], config).sum()) * config.page_size_bytes,
            f"restoring pool '{name}'",
            "restore into a smaller --size, destroy unused pools, or free memory",
        )
        # A replaced pool's chain carries over: its lower pool, remote and access log stay.
        link = chain_of(name) if replace else Link()
        builder = create_from_config(
            name,
            config,
            mode=mode,
            prealloc=prealloc,
            spill_to=link.spill_to or "",
            promote=link.promote,
            clock=clock,
            hidden=True,
            folder=target,
        )
        try:
            skipped = _load(reader, builder, records, chosen, progress)
            # Restoring ticked the clock once per entry; policies measure age
            # against it (LFU decays by it), so set it back to the snapshot's
            # (which every restored entry's clock values are within).
            builder.set_clock(snapshot_clock)
            publish(builder, replace=replace, force=force, **trust)
            write_settings(builder._segment.path, link.settings, mode)
        except BaseException:
            discard(builder)
            raise
        finally:
            builder.close()
    report = RestoreReport(
        num_restored=len(chosen) - len(skipped),
        num_expired=int(sound.sum()) - len(alive),
        num_dropped=len(alive) - len(chosen),
        skipped=nonsense + skipped,
    )
    return open_pool(name, clock=clock), report


def replace_size(config: PoolConfig, size_bytes: int) -> PoolConfig:
    """``config`` for a pool of another size; per-page defaults follow the new size."""
    pages = size_bytes // config.page_size_bytes
    scaled = config.max_entries == config.num_pages
    return replace_fields(
        config, size_bytes=size_bytes, max_entries=pages if scaled else config.max_entries
    )


def _choose_survivors(
    records: np.ndarray, config: PoolConfig, clock: int, now: float
) -> np.ndarray:
    """Indexes of the records to restore: all if they fit, else the policy's keepers."""
    pages = _pages(records, config)
    if pages.sum() <= config.num_pages and len(records) <= config.max_entries:
        return np.arange(len(records))
    table = np.zeros(len(records), ENTRY_DTYPE)
    for name in ("last_access", "created", "freq", "expires_at", "priority"):
        table[name] = records[name]
    table["num_pages"] = pages
    ctx = ScoreContext(clock, now, config.lfu_half_life)
    best_kept_first = rank_victims(get_policy(config.policy), table, ctx)[::-1]
    fits = (np.cumsum(pages[best_kept_first]) <= config.num_pages) & (
        np.arange(len(records)) < config.max_entries
    )
    return (
        best_kept_first[np.flatnonzero(fits)] if fits.all() else best_kept_first[: np.argmin(fits)]
    )


def _pages(records: np.ndarray, config: PoolConfig) -> np.ndarray:
    """The pages each record's entry takes in a pool of ``config`` (``Geometry.pages_for`` of
    every record at once: none in an inline slot)."""
    total = records["key_len"] + records["header_len"] + records["value_len"]
    pages = np.maximum(1, -(-total // config.page_size_bytes))
    return np.where(total <= config.inline_bytes, 0, pages)


def _load(
    reader: _Reader, pool: Pool, records: np.ndarray, chosen: np.ndarray, progress: Progress | None
) -> list[str]:
    """Copy the chosen entries from the file into ``pool``; return what was skipped."""
    skipped: list[str] = []
    lengths = records["key_len"] + records["header_len"] + records["value_len"]
    total, done = int(lengths[chosen].sum()), 0
    for index in chosen.tolist():
        problem = _load_entry(reader, pool, records[index])
        if problem:
            skipped.append(_skipped(reader, index, problem))
        done += int(lengths[index])
        if progress:
            progress(done, total)
    return skipped


def _load_entry(reader: _Reader, pool: Pool, record: np.void) -> str | None:
    """Copy one entry from the file into ``pool``; None if it was, else why it was left out."""
    start = HEADER_BYTES + int(record["offset"])
    key_len = int(record["key_len"])
    head = os.pread(reader.fd, key_len + int(record["header_len"]), start)
    problem = content_problem(record, head[:key_len], head[key_len:])
    if problem:
        return problem
    version = int(reader.header["format_version"])

    def fill(views: list[memoryview]) -> int | None:
        if not files.read_exactly(reader.fd, views, start):
            return None
        if entry_checksum(version, record, views) != int(record["checksum"]):
            return None
        # A version-1 sum covers the bytes only: the pool keeps today's kind.
        return pool_checksum(record, views) if version == 1 else int(record["checksum"])

    entry = StoredEntry.from_record(head[:key_len], record, int(record["checksum"]))
    restored = pool.write_entry(
        entry,
        fill,
        keep_history=True,
        evict_within_reserved=False,  # run short of memory: fail, never drop what was read
    )
    return None if restored else "damaged (checksum mismatch)"


def _skipped(reader: _Reader, index: int, why: str) -> str:
    """The report line for record ``index``, left out because of ``why``."""
    record = reader.records[index]
    key = os.pread(reader.fd, min(40, int(record["key_len"])), HEADER_BYTES + int(record["offset"]))
    return f"entry {index} (key {key!r}): {why}, left out"


class _Reader:
    """An open snapshot whose header and entry table have been verified."""

    def __init__(self, path: Path, trust: owners.Trust | None) -> None:
        """Open ``path``; ``trust`` says whose files to accept (None: anyone's)."""
        self.path = path
        where = f"snapshot {path}"
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # FIFOs: no wait
        except FileNotFoundError:
            raise SnapshotError(
                f"no snapshot at {path}: persist the pool first, or give --path"
            ) from None
        except OSError as exc:
            raise SnapshotError(
                f"cannot read {where} ({exc.strerror}): check its permissions"
            ) from exc
        try:
            info = os.fstat(self.fd)
            if not stat.S_ISREG(info.st_mode):
                raise SnapshotError(f"{where} is not a regular file: check the path")
            if trust is not None:
                trust.check(info, where)
            self.file_bytes = info.st_size
            raw_header = os.pread(self.fd, HEADER_BYTES, 0)
            self.header, self.config = decode_header(raw_header, self.file_bytes, where)
            self.mode = int(self.header["mode"]) or segment.DEFAULT_MODE  # 0: not recorded
            records_offset = int(self.header["records_offset"])
            record_bytes = os.pread(self.fd, self.file_bytes - records_offset, records_offset)
            self.records = check_records(self.header, raw_header, record_bytes, where)
        except OSError as exc:
            os.close(self.fd)
            raise SnapshotError(f"cannot read {where} ({exc.strerror}): check the file") from exc
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
