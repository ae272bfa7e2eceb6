"""codec: bytes and numpy arrays in and out of pages, never pickled, never trusting headers."""

from __future__ import annotations

import array
import struct
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvcache
from kvcache import CorruptPoolError, InvalidArgument, ValueTooLargeError
from kvcache.codec import MAX_NDIM, byte_view, encode, new_array

NO_LIMIT = 1 << 62
"""A ``max_bytes`` for encode that no test value reaches."""


def _decode(header: bytes, payload: bytes) -> bytes | np.ndarray:
    """What the pool does on a get: bytes as is, or a fresh array filled from the payload."""
    if not header:
        return bytes(payload)
    out = new_array(header, len(payload))
    byte_view(out)[:] = payload
    return out


def _round_trip(value: object) -> bytes | np.ndarray:
    encoded = encode(value, NO_LIMIT)
    assert encoded.payload.format == "B" and encoded.payload.ndim == 1
    assert encoded.is_array == bool(encoded.header)
    return _decode(encoded.header, bytes(encoded.payload))


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"hello",
        bytes(range(256)) * 3,
        bytearray(b"mutable"),
        memoryview(b"a view"),
        memoryview(b"0123456789")[2:7],
        array.array("d", [1.5, -2.0]),
        memoryview(np.arange(12, dtype=np.int32).reshape(3, 4)),  # multi-dim buffer, as bytes
    ],
    ids=["empty", "short", "binary", "bytearray", "memoryview", "slice", "array.array", "2d-view"],
)
def test_bytes_like_round_trip_as_bytes(value: object) -> None:
    out = _round_trip(value)
    assert type(out) is bytes
    assert out == bytes(memoryview(value).cast("B"))  # type: ignore[arg-type]


def test_bytes_are_not_copied_on_encode() -> None:
    data = bytearray(b"abcdef")
    encoded = encode(data, NO_LIMIT)
    data[0] = ord("z")
    assert bytes(encoded.payload) == b"zbcdef"  # a view, not a copy


DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.longdouble,
    np.complex64,
    np.complex128,
    ">i4",
    ">f8",
    "<u2",
]

SHAPES = [(), (0,), (5,), (3, 0, 2), (2, 3), (2, 3, 4), (1,) * MAX_NDIM]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d-{'x'.join(map(str, s[:4]))}")
def test_arrays_round_trip(dtype: object, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    value = np.asarray(rng.random(shape) * 100).astype(dtype)
    out = _round_trip(value)
    assert isinstance(out, np.ndarray)
    assert out.dtype == value.dtype
    assert out.shape == value.shape
    np.testing.assert_array_equal(out, value)
    assert out.flags.c_contiguous and out.flags.writeable


def test_zero_d_array_stays_zero_d() -> None:
    out = _round_trip(np.array(7.25))
    assert isinstance(out, np.ndarray) and out.shape == () and out == 7.25


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[::2],
        lambda a: a.T,
        lambda a: a[:, 1:3],
        lambda a: a[::-1, ::-3],
        lambda a: np.asfortranarray(a),
        lambda a: np.broadcast_to(a[0], (4, a.shape[1])),
    ],
    ids=["step", "transpose", "columns", "reversed", "fortran", "broadcast"],
)
def test_non_contiguous_arrays_round_trip_in_c_order(make: object) -> None:
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    value = make(base)  # type: ignore[operator]
    out = _round_trip(value)
    assert isinstance(out, np.ndarray) and out.shape == value.shape
    np.testing.assert_array_equal(out, value)


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(
        dtype=st.one_of(
            hnp.boolean_dtypes(),
            hnp.integer_dtypes(endianness="="),
            hnp.unsigned_integer_dtypes(endianness="="),
            hnp.floating_dtypes(endianness="="),
            hnp.complex_number_dtypes(endianness="="),
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5),
    )
)
def test_any_numeric_array_round_trips(value: np.ndarray) -> None:
    out = _round_trip(value)
    assert isinstance(out, np.ndarray)
    assert out.dtype == value.dtype and out.shape == value.shape
    assert out.tobytes() == value.tobytes()  # bit-exact, NaNs included


@pytest.mark.parametrize(
    "value",
    [
        "text",
        "",
        np.array(["a", "b"]),
        np.array([b"a"]),
        np.array([1, "x"], dtype=object),
        np.array([None]),
        np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
        np.zeros(2, dtype="V8"),
        np.array(["2024-01-01"], dtype="datetime64[D]"),
        np.array([1], dtype="timedelta64[s]"),
        np.zeros((1,) * (MAX_NDIM + 1)),
        123,
        1.5,
        None,
        [1, 2, 3],
        {"a": 1},
        memoryview(np.arange(10, dtype=np.int64))[::2],  # not contiguous
    ],
    ids=lambda v: type(v).__name__ + (f"-{v.dtype}" if isinstance(v, np.ndarray) else ""),
)
def test_unstorable_values_are_rejected(value: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        encode(value, NO_LIMIT)
    assert isinstance(info.value, ValueError)


def _header(ndim: int, dtype: bytes, shape: tuple[int, ...]) -> bytes:
    return struct.pack("<BB", ndim, len(dtype)) + dtype + struct.pack(f"<{len(shape)}q", *shape)


@pytest.mark.parametrize(
    ("header", "payload_bytes"),
    [
        (_header(1, b"<f8", (2**40,)), 8),  # a tiny payload claiming 8 TiB
        (_header(1, b"<f8", (3,)), 16),
        (_header(1, b"<f8", (-2,)), -16),
        (_header(2, b"<f8", (-1, -2)), 16),  # negative dims whose product matches
        (_header(1, b"|O", (1,)), 8),
        (_header(1, b"<U4", (1,)), 16),
        (_header(1, b"|V8", (1,)), 8),
        (_header(1, b"<M8[s]", (1,)), 8),
        (_header(1, b"nope", (1,)), 8),
        (_header(1, b"\xff\xfe", (1,)), 8),
        (_header(1, b"<i4,<i4", (1,)), 8),
        (_header(1, b"a8", (1,)), 8),  # numpy's deprecated bytes alias: only warned of
        (_header(1, b"f8", (1,)), 8),  # numpy reads it, but dtype.str never writes it
        (_header(1, b" <f8", (1,)), 8),
        (_header(2, b"<f8", (1,)), 8),  # shape shorter than ndim
        (_header(1, b"<f8", (1, 1)), 8),  # trailing bytes
        (_header(1, b"<f8", ()), 8),
        (b"", 0),
        (b"\x01", 0),
        (struct.pack("<BB", 0, 200) + b"<f8", 8),  # dtype length beyond the header
    ],
)
def test_damaged_headers_raise_corrupt_pool_error(header: bytes, payload_bytes: int) -> None:
    with pytest.raises(CorruptPoolError):
        new_array(header, payload_bytes)


@pytest.mark.parametrize(
    ("header", "payload_bytes"),
    [
        pytest.param(_header(2, b"|u1", (2**61 + 1, 8)), 8, id="2d-wraps-to-8"),
        pytest.param(_header(2, b"|u1", (2**32, 2**32)), 0, id="2d-wraps-to-0"),
        pytest.param(_header(3, b"<f8", (2**62, 4, 1)), 0, id="3d-wraps-to-0"),
        pytest.param(_header(100, b"|u1", (1,) * 100), 1, id="100-dims"),
        pytest.param(_header(MAX_NDIM + 1, b"|u1", (1,) * (MAX_NDIM + 1)), 1, id="33-dims"),
        pytest.param(_header(3, b"|u1", (0, 2**40, 2**40)), 0, id="empty-but-too-big"),
    ],
)
def test_new_array_rejects_shape_whose_product_overflows_int64(
    header: bytes, payload_bytes: int
) -> None:
    """Regression: np.prod(shape, dtype=int64) wrapped around, so a shape of 2**64
    elements passed the payload check and np.empty raised ValueError; so did more than
    numpy's 64 dimensions, and an empty shape too big for numpy. All are damage."""
    with pytest.raises(CorruptPoolError):
        new_array(header, payload_bytes)


@settings(max_examples=100, deadline=None)
@given(header=st.binary(max_size=300), payload_bytes=st.integers(0, 1 << 20))
def test_random_headers_never_crash(header: bytes, payload_bytes: int) -> None:
    try:
        out = new_array(header, payload_bytes)
    except CorruptPoolError:
        return
    assert out.nbytes == payload_bytes


@settings(max_examples=100, deadline=None)
@given(
    ndim=st.integers(0, 255),
    dtype=st.sampled_from([b"<f8", b"|u1", b"|b1", b"<c16", b">i2", b"<f2"]),
    dims=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=8),
    payload_bytes=st.integers(0, 1 << 16),
)
def test_random_shapes_never_crash(
    ndim: int, dtype: bytes, dims: list[int], payload_bytes: int
) -> None:
    shape = (dims * (ndim // max(1, len(dims)) + 1))[:ndim] if dims else (1,) * ndim
    try:
        out = new_array(_header(ndim, dtype, tuple(shape)), payload_bytes)
    except CorruptPoolError:
        return
    assert out.nbytes == payload_bytes and out.shape == tuple(shape)


def test_arrays_round_trip_through_a_pool(make_pool: Callable[..., kvcache.Pool]) -> None:
    """Through real pages: multi-page, non-contiguous and 0-d arrays come back equal."""
    pool = make_pool("256K", page_size="1K")
    values = {
        "big": np.arange(5000, dtype=np.float64).reshape(50, 100),  # 40 KB over 40 pages
        "strided": np.arange(300, dtype=np.int16).reshape(30, 10)[::3, ::-2],
        "scalar": np.array(3 + 4j),
        "empty": np.zeros((0, 7), dtype=np.uint32),
        "flags": np.array([True, False, True]),
        "bytes": b"\x00\x01" * 3000,
    }
    for key, value in values.items():
        pool.put(key, value)
    for key, value in values.items():
        out = pool.get(key)
        if isinstance(value, bytes):
            assert out == value
        else:
            assert isinstance(out, np.ndarray)
            assert out.dtype == value.dtype and out.shape == value.shape
            np.testing.assert_array_equal(out, value)


def test_regression_comma_dtype_string_raised_syntax_error() -> None:
    """Hypothesis found it: numpy parses the dtype text "," with ``ast`` and raises SyntaxError."""
    with pytest.raises(CorruptPoolError):
        new_array(b"\x00\x01,", 0)


def test_regression_a_huge_broadcast_array_raised_memory_error(
    make_pool: Callable[..., kvcache.Pool],
) -> None:
    """``broadcast_to`` makes a 1 TiB array out of one byte: encode copied it into C order
    (MemoryError) before the pool could say it is too large. It is measured first now."""
    pool = make_pool("1M")
    pool.put("kept", b"v")
    huge = np.broadcast_to(np.uint8(0), (1 << 40,))
    with pytest.raises(ValueTooLargeError, match=r"needs 1\.0T but at most 1\.0M fit"):
        pool.put("huge", huge)
    assert "huge" not in pool and pool.get("kept") == b"v"


@pytest.mark.parametrize("max_bytes", [0, 68])
def test_an_array_to_copy_is_measured_before_the_copy(max_bytes: int) -> None:
    """The limit covers header and payload: a strided (2, 3) float64 view needs 21 + 48."""
    strided = np.zeros((4, 3))[::2]
    with pytest.raises(ValueTooLargeError, match=f"needs 69B but at most {max_bytes}B"):
        encode(strided, max_bytes)
    assert len(encode(strided, 69).payload) == 48
