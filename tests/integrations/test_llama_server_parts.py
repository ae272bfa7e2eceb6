"""The llama-server proxy's parts that need no server: keys, slot files, slots, the slot folder."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from kvcache import InvalidArgument
from kvcache.integrations.llama_server import identity, slotfile
from kvcache.integrations.llama_server.exchange import check_private
from kvcache.integrations.llama_server.slots import SlotTable
from kvcache.safepath import UnsafePathError

PROPS = {"default_generation_settings": {"n_ctx": 2048}, "total_slots": 1, "build_info": "b1-x"}


def test_settings_fold_aliases_and_leave_out_what_kv_does_not_depend_on() -> None:
    one = identity.server_settings(["-m", "a.gguf", "-c", "4096", "-fa", "on", "--port", "80"])
    two = identity.server_settings(["--flash-attn", "on", "-t", "3", "--ctx-size", "4096"])
    assert one == two == {"--ctx-size": "4096", "--flash-attn": "on"}
    assert identity.server_settings(["-kvu", "-np", "4"]) == {"--kv-unified": "", "--parallel": "4"}
    assert identity.server_settings(["--rope-freq-base=1e6", "--lora", "a", "--lora", "b"]) == {
        "--rope-freq-base": "1e6",
        "--lora": "a b",
    }
    assert identity.server_settings(["--override-kv", "x=int:-1"]) == {"--override-kv": "x=int:-1"}


def test_layouts_differ_with_every_setting_and_fact() -> None:
    base = identity.layout(PROPS, {"--ctx-size": "2048"})
    assert base == identity.layout(dict(PROPS), {"--ctx-size": "2048"})
    assert base != identity.layout(PROPS, {"--ctx-size": "2048", "--cache-type-k": "q8_0"})
    assert base != identity.layout({**PROPS, "build_info": "b2-y"}, {"--ctx-size": "2048"})
    assert base != identity.layout({**PROPS, "total_slots": 2}, {"--ctx-size": "2048"})
    assert base != identity.layout(PROPS, None)
    assert ("server_args", "unspecified") in identity.layout(PROPS, None).settings


def test_model_digest_names_content_and_is_remembered(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"weights" * 1000)
    (tmp_path / "b.gguf").write_bytes(b"weights" * 1000)
    (tmp_path / "c.gguf").write_bytes(b"weightz" * 1000)
    memo = tmp_path / "memo"
    a = identity.model_digest(tmp_path / "a.gguf", memo)
    assert a == identity.model_digest(tmp_path / "b.gguf", memo)  # a copy: the same model
    assert a != identity.model_digest(tmp_path / "c.gguf", memo)
    assert a.startswith("gguf-blake2b:7000:")
    # the memo is used while path, size, mtime and inode are unchanged ...
    stat = os.stat(tmp_path / "a.gguf")
    with open(tmp_path / "a.gguf", "r+b") as file:
        file.write(b"W")
    os.utime(tmp_path / "a.gguf", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert identity.model_digest(tmp_path / "a.gguf", memo) == a
    # ... and not once the mtime moves
    os.utime(tmp_path / "a.gguf", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert identity.model_digest(tmp_path / "a.gguf", memo) != a


def slot_file(tokens: list[int], media: int = 0, plain: bool = False) -> bytes:
    packed = tokens if plain else [-1, 1, len(tokens), *tokens, media]
    head = struct.pack("<III", slotfile.MAGIC, slotfile.VERSION, len(packed))
    return head + struct.pack(f"<{len(packed)}i", *packed) + b"kv bytes"


def test_slot_files_give_their_tokens_or_none() -> None:
    assert slotfile.read_tokens(slot_file([1, 5, 9])).tolist() == [1, 5, 9]
    assert slotfile.read_tokens(slot_file([1, 5], plain=True)).tolist() == [1, 5]
    assert slotfile.read_tokens(slot_file([])).tolist() == []
    assert slotfile.read_tokens(slot_file([1, 5, 9], media=1)) is None
    assert slotfile.read_tokens(slot_file([1, 5, 9])[:20]) is None
    assert slotfile.read_tokens(b"ggsq" + slot_file([1])[4:]) is None  # the magic's bytes reversed
    assert slotfile.read_tokens(b"") is None


def test_slots_go_to_the_best_holder_and_the_line_is_bounded() -> None:
    async def scenario() -> None:
        table = SlotTable(2, max_waiting=1)
        a, b = np.arange(10), np.arange(10) + 100
        first = await table.acquire(a)
        second = await table.acquire(b)
        table.release(first, a)  # type: ignore[arg-type]
        table.release(second, b)  # type: ignore[arg-type]
        assert await table.acquire(b) == second and await table.acquire(a) == first
        waiter = asyncio.ensure_future(table.acquire(a))
        await asyncio.sleep(0)
        assert await table.acquire(a) is None  # the line is full: back-pressure
        table.release(second, None)  # type: ignore[arg-type]
        assert await waiter == second
        cancelled = asyncio.ensure_future(table.acquire(a))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        table.release(first, None)  # type: ignore[arg-type]
        assert await table.acquire(a) == first  # no slot was lost to the cancelled waiter

    asyncio.run(scenario())


def test_the_slot_folder_must_be_private(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir(mode=0o700)
    assert check_private(folder) == folder
    folder.chmod(0o750)
    with pytest.raises(InvalidArgument, match="chmod 700"):
        check_private(folder)
    with pytest.raises(InvalidArgument, match="not a directory"):
        check_private(Path(__file__))
    with pytest.raises(InvalidArgument, match="No such file"):
        check_private(tmp_path / "missing")


def test_the_slot_folder_must_lie_where_no_other_user_can_swap_it(tmp_path: Path) -> None:
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)  # not sticky: anyone may rename the private folder in it
    folder = open_to_all / "slots"
    folder.mkdir(mode=0o700)
    with pytest.raises(UnsafePathError, match="slot folder"):
        check_private(folder)
    open_to_all.chmod(0o755)
    assert check_private(folder) == folder
