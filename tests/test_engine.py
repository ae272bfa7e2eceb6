"""The engine alone: a ``Store`` over one segment, with no ``Pool`` above it.

These tests build the segment as ``create`` does and drive the ``Store``'s own
interface (write, read, whole entries, repair, close), so that what a compiled
core would have to do is pinned down without the tiers, the remote or the
mapping conventions.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import kvcache
from kvcache import durable, segment, transfer
from kvcache.config import PoolConfig
from kvcache.engine import Store, closing, upkeep, whole
from kvcache.errors import PoolClosedError
from kvcache.layout import Geometry, write_header
from kvcache.stored import StoredEntry

StoreMaker = Callable[..., Store]


@pytest.fixture
def make_store(names: Callable[[], str]) -> Iterator[StoreMaker]:
    """Stores over new segments made as ``kvcache.create`` makes them; closed afterwards."""
    stores: list[Store] = []

    def make(size: str = "4M", **config: object) -> Store:
        pool_config = PoolConfig(size_bytes=kvcache.units.parse_size(size), **config)  # type: ignore[arg-type]
        geometry = Geometry.for_config(pool_config)

        def initialise(seg: segment.Segment) -> None:
            write_header(seg.buffer, pool_config, geometry, time.time(), 0)
            durable.mark_new(seg)

        seg = segment.create(names(), geometry.total_bytes, geometry.data_offset, 0o600, initialise)
        store = Store(
            seg,
            pool_config,
            geometry,
            verify_reads=False,
            observe=False,
            clock=time.time,
            rng=np.random.default_rng(0),
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        closing.close(store)


def _write(store: Store, key: bytes, value: bytes) -> bool:
    """A put as the engine sees one: encoded key and value bytes, summed before the lock."""
    pieces = (key, value)
    checksum = transfer.checksum(pieces, 0, len(key), 0, len(value))

    def fill(targets: list[memoryview]) -> int:
        transfer.scatter(targets, pieces)
        return checksum

    return store.write(key, 0, 0, len(value), 0, float("inf"), fill)


def _read(store: Store, key: bytes) -> bytes | None:
    return store.read(key, lambda header, payload: bytes(transfer.materialise(header, payload)))


def test_a_store_alone_writes_reads_and_deletes(make_store: StoreMaker) -> None:
    store = make_store()
    assert _write(store, b"key", b"value" * 1000)
    assert _read(store, b"key") == b"value" * 1000
    assert store.contains(b"key") and not store.contains(b"other")
    assert store.delete(b"key") and _read(store, b"key") is None
    assert upkeep.check(store) == []


def test_a_store_evicts_by_its_policy_to_make_room(make_store: StoreMaker) -> None:
    store = make_store("1M", policy="fifo")
    value = bytes(100_000)
    for i in range(20):
        assert _write(store, f"k{i:02d}".encode(), value)
    assert _read(store, b"k00") is None and _read(store, b"k19") == value  # first in, first out
    assert upkeep.stats(store).evictions > 0 and upkeep.check(store) == []


def test_whole_entries_move_between_two_stores(make_store: StoreMaker) -> None:
    """What a spill or a promotion does, with no pool above either store."""
    source, target = make_store(), make_store()
    _write(source, b"moved", b"x" * 200_000)
    ref = whole.locate(source, b"moved")
    assert ref is not None
    read = whole.read_entry(source, ref)
    assert read is not None
    entry, views = read
    assert isinstance(entry, StoredEntry)

    def fill(targets: list[memoryview]) -> int | None:
        transfer.scatter(targets, tuple(views))
        return entry.checksum if whole.confirm(source, ref, entry, views) else None

    assert whole.write_entry(target, entry, fill)
    assert whole.remove_entry(source, ref)
    assert _read(target, b"moved") == b"x" * 200_000 and _read(source, b"moved") is None
    assert upkeep.check(source) == [] and upkeep.check(target) == []


def test_a_closed_store_refuses_every_call(make_store: StoreMaker) -> None:
    store = make_store()
    _write(store, b"key", b"value")
    closing.close(store)
    for call in (
        lambda: _read(store, b"key"),
        lambda: _write(store, b"key", b"value"),
        lambda: store.delete(b"key"),
        lambda: upkeep.stats(store),
        lambda: upkeep.check(store),
    ):
        with pytest.raises(PoolClosedError):
            call()
    closing.close(store)  # again: nothing happens


def test_the_engine_imports_nothing_above_it() -> None:
    """No pool, tier, remote, access log, prefix or command line in the engine's imports."""
    above = {"pool", "tiers", "mapping", "lifecycle", "accesslog", "settings", "remote",
             "prefix", "snapshot", "cli", "integrations"}  # fmt: skip
    folder = Path(kvcache.engine.__file__).parent
    for source in folder.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [node.module or ""] if node.module else [a.name for a in node.names]
                if node.level == 2:  # from ..X import
                    assert not {n.split(".")[0] for n in names} & above, (source.name, names)
