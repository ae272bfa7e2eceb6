"""The compiled copy-and-sum against its pure-Python twin (``kvcache.native``)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcache
from kvcache import native, transfer

compiled = pytest.mark.skipif(
    native.sum_and_copy is None and bool(os.environ.get("KVCACHE_PURE_PYTHON")),
    reason="KVCACHE_PURE_PYTHON is set: this run tests the pure-Python path",
)


@compiled
def test_the_extension_is_built_by_the_install() -> None:
    # setup.sh installs with a C compiler at hand: a missing extension is a build failure
    assert native.sum_and_copy is not None
    assert native.Finder is not None
    assert native.engine() == "compiled"


@compiled
def test_pure_python_is_chosen_by_the_environment() -> None:
    code = "from kvcache import native; print(native.engine())"
    for value, engine in (("1", "pure-python"), ("0", "compiled"), ("", "compiled")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "KVCACHE_PURE_PYTHON": value},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == engine


def _split(data: bytes | memoryview, cuts: list[int]) -> list[Any]:
    """``data`` cut at ``cuts`` (taken modulo its length) into adjacent pieces."""
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(edges)]


@compiled
@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=40_000),
    st.lists(st.integers(0, 40_000), max_size=4),
    st.lists(st.integers(0, 40_000), max_size=4),
    st.binary(max_size=64),
    st.integers(0, 9),
)
def test_one_pass_sums_and_copies_as_the_two_passes_do(
    data: bytes, source_cuts: list[int], target_cuts: list[int], head: bytes, slack: int
) -> None:
    assert native.sum_and_copy is not None
    sources = _split(data, source_cuts)
    window = bytearray(b"\xee" * (len(data) + slack))
    targets = _split(memoryview(window), target_cuts)
    digest = native.sum_and_copy([head], sources, targets)
    assert digest == xxhash.xxh3_64(head + data).intdigest()
    assert bytes(window[: len(data)]) == data
    assert window[len(data) :] == b"\xee" * slack  # nothing written past the copy
    assert native.sum_and_join is not None
    assert native.sum_and_join([head], sources) == (digest, data)


@compiled
@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 200_000),
    st.lists(st.integers(0, 200_000), max_size=4),
    st.lists(st.integers(0, 200_000), max_size=4),
    st.integers(0, 63),
)
def test_a_streamed_copy_sums_and_copies_as_the_two_passes_do(
    size: int, source_cuts: list[int], target_cuts: list[int], misalign: int
) -> None:
    """Round the cache from 64 KiB up, into targets at any alignment."""
    assert native.sum_and_stream is not None
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    window = bytearray(b"\xee" * (misalign + size + 7))
    targets = _split(memoryview(window)[misalign : misalign + size], target_cuts)
    digest = native.sum_and_stream([b"head"], _split(data, source_cuts), targets)
    assert digest == xxhash.xxh3_64(b"head" + data).intdigest()
    assert bytes(window[misalign : misalign + size]) == data
    assert window[:misalign] == b"\xee" * misalign  # nothing written outside the copy
    assert window[misalign + size :] == b"\xee" * 7


@compiled
@pytest.mark.parametrize("size", [100, 256, 4099, 70_000])
def test_copy_is_exact_at_every_distance_from_its_source(size: int) -> None:
    """``copy`` (and the sums' copies) take their own loop where the target lies 1-63
    bytes past the source modulo a page: every distance around that range, exact, and
    nothing written outside the target."""
    assert native.copy is not None and native.sum_and_copy is not None
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    source_map, target_map = mmap.mmap(-1, size + 8192), mmap.mmap(-1, size + 8192)
    source = np.frombuffer(source_map, np.uint8)
    target = np.frombuffer(target_map, np.uint8)
    source[5 : 5 + size] = data
    for distance in [0, 1, 2, 14, 62, 63, 64, 65, 4095]:
        at = 5 + distance
        for copy in (
            lambda out: native.copy([source[5 : 5 + size]], [out]),
            lambda out: native.sum_and_copy([], [source[5 : 5 + size]], [out]),
        ):
            target[:] = 0xEE
            copy(target[at : at + size])
            assert np.array_equal(target[at : at + size], data), distance
            assert (target[:at] == 0xEE).all() and (target[at + size :] == 0xEE).all()


@compiled
@pytest.mark.parametrize(
    "size", [8197, 262147, (16 << 20) + 3], ids=["compiled put and get", "large", "streamed"]
)
@pytest.mark.parametrize("verify", [False, True])
def test_values_go_in_and_out_whole_at_every_distance_from_their_pages(
    make_pool: Callable[..., kvcache.Pool], size: int, verify: bool
) -> None:
    """A 2-byte key puts the value 2 bytes into its page; puts from buffers that far
    before it and get_into into buffers that far past it, modulo a page, 0-70 bytes (the
    copies' own loop from 1 to 63; from 16 MiB the read streams round the cache, each
    target line whole), give every byte back."""
    pool = make_pool("40M" if size > 8 << 20 else "8M", page_size="64K")
    reader = kvcache.open(pool.name, verify_reads=verify)
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    buffer = np.zeros(size + 8192, np.uint8)
    try:
        for distance in (0, 1, 13, 14, 40, 63, 64, 70):
            at = (2 - distance - buffer.ctypes.data) % 4096
            buffer[at : at + size] = data
            pool.put("kv", memoryview(buffer[at : at + size]))
            buffer[:] = 0
            at = (2 + distance - buffer.ctypes.data) % 4096
            assert reader.get_into("kv", buffer[at : at + size]) == size
            assert np.array_equal(buffer[at : at + size], data), distance
        assert reader.get("kv") == data.tobytes()
    finally:
        reader.close()


@compiled
def test_scatter_summed_matches_the_pure_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    pieces = (b"key", b"header", rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    fields = (1, 3, 6, 1 << 20)
    results = []
    for path in (native.sum_and_stream, None):  # compiled, then the pure-Python twin
        monkeypatch.setattr(native, "sum_and_stream", path)
        window = bytearray(sum(map(len, pieces)) + 5)
        views = [memoryview(window)[:1000], memoryview(window)[1000:]]
        results.append((transfer.scatter_summed(views, pieces, fields), bytes(window)))
    assert results[0] == results[1]
    assert results[0][0] == transfer.checksum(pieces, *fields)
    # negative control: another field changes the sum
    assert results[0][0] != transfer.checksum(pieces, 0, 3, 6, 1 << 20)


@compiled
def test_bad_buffers_are_refused_not_written_past() -> None:
    assert native.sum_and_copy is not None
    small = bytearray(3)
    with pytest.raises(ValueError, match="fewer than"):
        native.sum_and_copy([], [b"four"], [small])
    assert small == bytearray(3)
    with pytest.raises(BufferError):
        native.sum_and_copy([], [b"ab"], [b"read-only"])
    with pytest.raises(TypeError):
        native.sum_and_copy([], [1], [small])
    with pytest.raises(TypeError):
        native.sum_and_copy([], 5, [])  # type: ignore[arg-type]
    strided = np.zeros(8, np.uint8)[::2]
    with pytest.raises((BufferError, ValueError)):
        native.sum_and_copy([], [b"ab"], [strided])


ASAN_DRIVER = """
import importlib.util, random, sys
import numpy as np
spec = importlib.util.spec_from_file_location("kvcache._copysum", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
rng = random.Random(7)
for _ in range(3000):
    data = rng.randbytes(rng.choice([0, 1, 100, 16383, 16384, 16385, 70000, 200001]))
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randrange(4)))
    sources = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    window = np.empty(len(data) + rng.randrange(3), np.uint8)  # malloc'd whole: ASAN's redzones
    edges = sorted(rng.randrange(len(window) + 1) for _ in range(rng.randrange(4)))
    targets = [memoryview(window)[a:b] for a, b in zip([0, *edges], [*edges, len(window)])]
    digest = module.sum_and_copy([data[:9]], sources, targets)
    assert window[: len(data)].tobytes() == data
    assert module.sum_and_join([data[:9]], sources) == (digest, data)
    window[:] = 0
    assert module.sum_and_stream([data[:9]], sources, targets) == digest
    assert window[: len(data)].tobytes() == data
    window[:] = 0
    assert module.copy(sources, targets) is None
    assert window[: len(data)].tobytes() == data
    try:
        module.sum_and_copy([], [data + b"x"], [memoryview(window)[: len(data)]])
    except ValueError:
        pass
    else:
        raise AssertionError("a short target was accepted")
print("clean")
"""


def run_sanitized(
    tmp_path: Path,
    source_name: str,
    driver_code: str,
    defines: tuple[str, ...] = (),
    **env: str,
) -> None:
    """Build ``_native/<source_name>.c`` with -fsanitize=address,undefined (and
    ``defines``, each -DNAME) and run ``driver_code`` with the build's path as its
    argument; it must print "clean"."""
    import sysconfig

    source = Path(native.__file__).parent / "_native" / f"{source_name}.c"
    library = tmp_path / f"_{source_name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-omit-frame-pointer",
            "-shared",
            "-fPIC",
            f"-I{sysconfig.get_paths()['include']}",
            *(f"-D{name}" for name in defines),
            str(source),
            "-o",
            str(library),
        ],
        check=True,
    )
    runtime = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    driver = tmp_path / "driver.py"
    driver.write_text(driver_code)
    run = subprocess.run(
        [sys.executable, str(driver), str(library)],
        env={
            **os.environ,
            "LD_PRELOAD": runtime,
            "ASAN_OPTIONS": "detect_leaks=0",
            "PYTHONMALLOC": "malloc",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            **env,
        },
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and run.stdout.strip() == "clean", run.stderr[-3000:]


@compiled
@pytest.mark.parametrize("defines", [(), ("KVCACHE_NO_AVX2",)], ids=["best", "sse2"])
def test_the_extension_is_clean_under_address_sanitizer(
    tmp_path: Path, defines: tuple[str, ...]
) -> None:
    """Built with -fsanitize=address and driven over every edge of its stretch loop, with
    the streamed copy the CPU picks and with the SSE2 one every x86-64 has."""
    run_sanitized(tmp_path, "copysum", ASAN_DRIVER, defines)


LOOKUP_ASAN_DRIVER = """
import importlib.util, os, random, sys, uuid
import numpy as np
import kvcache
from kvcache import fastpath, native, sketch
from kvcache.keys import encode_key
from kvcache.layout import H
assert native.Finder is None  # this process runs kvcache pure; only the build under test is C
spec = importlib.util.spec_from_file_location("kvcache._lookup", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
name = f"asan-{uuid.uuid4().hex[:8]}"
inline_bytes = int(os.environ["INLINE_BYTES"])  # values of up to 100 bytes or so in slots
# prefix: arc's lists, and the request counts a hit raises (kvcache.sketch)
pool = kvcache.create(name, "128K", page_size="1K", policy="prefix", inline_bytes=inline_bytes)
try:
    keys = [f"key{i}" * (i % 7 + 1) for i in range(40)]
    for i, key in enumerate(keys):
        pool.put(key, bytes([i]) * (i * 97 % 3000))
    g = pool._engine.views.geometry
    segment = np.frombuffer(pool._engine.segment.buffer, np.uint8, g.total_bytes).copy()
    segment[: g.entries_offset].view(np.int64)[H.flock_users] = 0  # read: no flock-only user
    rng = random.Random(7)
    finders = [  # each kind of hit and queue put (prefix's lists serve s3fifo's and arc's)
        module.Finder(g.entries_offset, g.max_entries, g.index_offset, g.index_slots,
                      g.page_next_offset, g.data_offset, g.num_pages, g.page_size_bytes,
                      g.total_bytes, 100, hit_kind, 3, g.live_offset, rng.choice([0, 3]),
                      g.inline_offset, g.inline_bytes, g.sketch_offset, g.sketch_bytes,
                      rng.choice([1, sketch.period_for(g.max_entries)]), g.ghost_offset,
                      queue_policy, fastpath.FIELDS)
        for hit_kind, queue_policy in (
            (fastpath.HIT_TOUCH, 0),
            (fastpath.HIT_COUNTS_READS, fastpath.QUEUE_POLICIES["s3fifo"]),
            (fastpath.HIT_MOVES_TO_MAIN, fastpath.QUEUE_POLICIES["arc"]),
            (fastpath.HIT_MOVES_TO_MAIN, fastpath.QUEUE_POLICIES["prefix"]),
        )
    ]
    words = segment[: g.data_offset].view(np.int64)
    found = stored = queued = evicted = rounds = 0
    for _ in range(4000):
        mapping = segment.copy()  # malloc'd whole: a read past its end meets ASAN's redzone
        damaged = mapping[: g.data_offset].view(np.int64)
        for _ in range(rng.randrange(4)):
            at = rng.randrange(rng.choice([0, g.entries_offset // 8]), len(words))
            damaged[at] = rng.choice([-1, 0, 1, 2, 1 << 62, -(1 << 63), (1 << 63) - 1,
                                      rng.randrange(-1000, 1000), int(damaged[at]) + 1])
        view = memoryview(mapping)
        for key in rng.sample(keys, 5) + ["absent"]:
            finder = rng.choice(finders)
            eid = finder.find_hit(view, encode_key(key)[0], 0.0, rng.random() < 0.5)
            found += eid >= 0
            for probe in (eid, rng.randrange(-2, g.max_entries + 2)):
                verify = rng.random() < 0.5
                finder.copy_value(view, probe, 1 << 16, verify)
                target = np.empty(rng.choice([0, 1, 100, 3000]), np.uint8)  # malloc'd whole
                finder.copy_into(view, probe, target, 1 << 16, verify)
            key_bytes = encode_key(key)[0]
            # a queue hit takes the lock word here (0: left to the lock), else touches alone;
            # where another holds it (9), the hit is deferred to the header's ring
            word = rng.choice([(), (0,), (5,)])
            damaged[H.lock_word] = rng.choice([0, 0, 9])
            value = finder.read(view, key_bytes, 0.0, None, rng.random() < 0.5, *word)
            found += value is not None
            target = np.empty(rng.choice([0, 1, 100, 3000]), np.uint8)
            finder.read(view, key_bytes, 0.0, target, rng.random() < 0.5, *word)
            found += finder.present(view, key_bytes, 0.0) is True
            for put_key in (key_bytes, f"new{rng.randrange(100)}".encode()):  # replace, add
                payload = np.full(rng.choice([0, 1, 1000, 5000]), 7, np.uint8)  # malloc'd whole
                # held by the caller, or taken here; the request made already, or not
                lock_word = rng.choice([(), (5,), (0, True), (5, False)])
                stored += finders[0].put(view, put_key, 0, b"", payload, 0, float("inf"), 0.0,
                                         0, 1, *lock_word) not in (None, -1)
                # a queue policy's put: recall, admission, in prefix's tree under a parent
                parent = rng.choice([None, encode_key(rng.choice(keys))[0], b"absent"])
                queued += rng.choice(finders[1:]).put(
                    view, put_key, 0, b"", payload, 0, float("inf"), 0.0, 0, 1,
                    rng.choice([0, 5]), False, parent) not in (None, -1, -2)
            eid = finders[0].reserve(view, key_bytes, 0, 0, rng.choice([0, 70000]), 0,
                                     float("inf"), 0.0, 0, 1)
            eid = rng.randrange(-2, g.max_entries + 2) if eid is None else eid
            stored += finders[0].publish(view, eid, rng.randrange(1 << 64), 0.0) is True
        damaged[H.lock_word] = 0
        rng.choice(finders).drain(view)  # the deferred hits, the ring's words damaged or not
        finders[0].tick(view, rng.random() < 0.5)
        evicted += finders[0].evict(view, rng.randrange(-2, g.max_entries + 2), 0.0) is True
        sample = np.array([rng.randrange(-1, g.max_entries + 1) for _ in range(100)], np.int64)
        finders[0].rank(view, rng.randrange(1, 6), sample, rng.randrange(1, 17), 0.0)
        draws = np.array([rng.randrange(1 << 64) for _ in range(rng.randrange(1, 64))], np.uint64)
        room_key = rng.choice([None, encode_key(rng.choice(keys))[0], b"absent"])
        left = finders[0].make_room(view, rng.randrange(1, 6), room_key,
                                    rng.choice([0, 1, 1 << 20]), draws, rng.randrange(1, 17), 0.0)
        rounds += left is not None
    assert found > 2000 and stored > 4000 and queued > 2000 and evicted > 100 and rounds > 100, (
        found, stored, queued, evicted, rounds)
finally:
    pool.close()
    kvcache.destroy(name)
print("clean")
"""


@compiled
@pytest.mark.parametrize("inline_bytes", [0, 128])
def test_the_lookup_is_clean_under_address_sanitizer_on_damaged_segments(
    tmp_path: Path, inline_bytes: int
) -> None:
    """kvcache._lookup built with -fsanitize=address,undefined, probing segments whose
    index, entry table and page links are overwritten at random: no read outside them.
    With inline slots, entries' page counts overwritten to 0 send reads to slots."""
    run_sanitized(
        tmp_path,
        "lookup",
        LOOKUP_ASAN_DRIVER,
        KVCACHE_PURE_PYTHON="1",
        INLINE_BYTES=str(inline_bytes),
    )


POOLLOCK_ASAN_DRIVER = """
import importlib.util, random, sys
spec = importlib.util.spec_from_file_location("kvcache._poollock", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
words = 8
header = bytearray(words * 8)  # malloc'd: a word past its end meets ASAN's redzone
view = memoryview(header).cast("Q")
for bad in (-1, words, 1 << 40, -(1 << 62)):
    for call in (lambda: module.lock(header, bad, 1, 5), lambda: module.unlock(header, 0, bad),
                 lambda: module.take_over(header, bad, 1, 5, 6)):
        try:
            call()
        except (ValueError, OverflowError):
            continue
        raise AssertionError(f"index {bad} was accepted")
try:
    module.lock(memoryview(bytearray(72))[1:65], 0, 1, 5)  # a misaligned header
    raise AssertionError("a misaligned header was accepted")
except ValueError:
    pass
assert module.lock(header, 0, 1, 5) == 0 and view[0] == 5
assert module.lock(header, 0, 1, 6) == -1  # held: a wait that times out
assert module.take_over(header, 0, 1, 4, 6) == -1  # not the word seen
view[1] = 1
assert module.take_over(header, 0, 1, view[0], 6) == 1
assert view[0] & 0x1FFFFF == 6  # the owner replaced, the waiters mark kept
module.unlock(header, 0, 1)
assert view[0] == 0
rng = random.Random(3)
for _ in range(300):
    view[0] = rng.choice([0, 1, 1 << 31, (1 << 64) - 1, 1 << 63, rng.getrandbits(64)])
    if view[0]:
        assert module.lock(header, 0, 1, 5) == -1
        assert module.take_over(header, 0, 1, view[0], 5) in (0, 1)
    module.unlock(header, 0, 1)
    assert module.lock(header, rng.randrange(words), rng.randrange(words), 7) in (0, 1, -1)
    module.unlock(header, 0, 1)
print("clean")
"""


@pytest.mark.skipif(native.poollock is None, reason="kvcache._poollock is not built here")
def test_the_lock_word_is_clean_under_address_sanitizer(tmp_path: Path) -> None:
    """kvcache._poollock built with -fsanitize=address,undefined: word indices past the
    header and misaligned headers refused, any value of the word handled."""
    run_sanitized(tmp_path, "poollock", POOLLOCK_ASAN_DRIVER)
