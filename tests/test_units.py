"""units: human sizes and durations in, human sizes out."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache import InvalidArgument, format_size, parse_duration, parse_size
from kvcache.units import MAX_SIZE_BYTES

K, M, G, T, P = 1 << 10, 1 << 20, 1 << 30, 1 << 40, 1 << 50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16G", 16 * G),
        ("512M", 512 * M),
        ("1.5G", 3 * G // 2),
        ("4096", 4096),
        ("64K", 64 * K),
        ("64k", 64 * K),
        ("1GiB", G),
        ("2GB", 2 * G),
        ("2KiB", 2 * K),
        ("1kb", K),
        ("16Gi", 16 * G),  # the Kubernetes spelling: was refused while 16GiB was accepted
        ("512Mi", 512 * M),
        ("64Ki", 64 * K),
        ("1Ti", T),
        ("1Pi", P),
        ("2gi", 2 * G),
        ("1.5 Gi", 3 * G // 2),
        ("1PiB", P),
        ("100B", 100),
        ("1T", T),
        ("1P", P),
        (".5K", 512),
        (" 16G ", 16 * G),
        ("16 G", 16 * G),
        (4096, 4096),
        (4096.9, 4096),  # a float is bytes, rounded down
    ],
)
def test_parse_size_accepts(text: str | float, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-1",
        "-1G",
        "0",
        "0G",
        "0.1",  # rounds down to zero bytes
        0,
        -5,
        0.4,
        "abc",
        "G",
        "1.2.3G",
        "16X",
        "16GG",
        "16Gii",
        "16GiBB",
        "16BG",
        "16iB",  # was taken as 16 bytes
        "16i",
        "16Xi",
        "1e3",
        "nan",
        "inf",
        float("nan"),
        float("inf"),
        float("-inf"),
        True,
        False,
        None,
        [16],
        b"16G",
        "2P",  # absurd: over 1 PiB
        MAX_SIZE_BYTES + 1,
        "1025T",
    ],
)
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_size(text)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert str(info.value)


def test_parse_size_names_what_the_size_is_for() -> None:
    with pytest.raises(InvalidArgument, match="page size"):
        parse_size("lots", what="page size")


def test_parse_size_error_shows_an_example() -> None:
    with pytest.raises(InvalidArgument, match="16G"):
        parse_size("lots")


def test_parse_size_one_pib_is_the_limit() -> None:
    assert parse_size(MAX_SIZE_BYTES) == P
    with pytest.raises(InvalidArgument, match="absurd"):
        parse_size(P + 1)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("9" * 400, id="400-digit-text"),
        pytest.param(10**400, id="400-digit-int"),
        pytest.param("1" + "0" * 320 + "K", id="321-digit-K"),
    ],
)
def test_parse_size_rejects_overflowing_numbers_as_invalid_argument(text: object) -> None:
    """Regression: these raised OverflowError (math.floor(inf), math.isfinite(huge int))."""
    with pytest.raises(InvalidArgument):
        parse_size(text)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_SIZE_BYTES))
def test_parse_size_of_plain_integers_is_identity(n: int) -> None:
    assert parse_size(n) == n
    assert parse_size(str(n)) == n


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=1023),
    st.sampled_from([("K", K), ("M", M), ("G", G), ("T", T)]),
    st.sampled_from(["", "B", "iB"]),
    st.booleans(),
)
def test_parse_size_units(n: int, unit: tuple[str, int], suffix: str, lower: bool) -> None:
    letter, scale = unit
    text = f"{n}{letter}{suffix}"
    assert parse_size(text.lower() if lower else text) == n * scale


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90.0),
        ("90s", 90.0),
        ("90S", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("2d", 172800.0),
        (" 2 d ", 172800.0),
        (0.25, 0.25),
        (600, 600.0),
    ],
)
def test_parse_duration_accepts(text: str | float, expected: float) -> None:
    assert parse_duration(text) == expected
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1s",
        "-5",
        "0",
        "0s",
        0,
        -1,
        -0.5,
        "soon",
        "1w",
        "1hour",
        "nan",
        float("nan"),
        float("inf"),
        pytest.param("9" * 400, id="400-digit-text"),
        pytest.param(10**400, id="400-digit-int"),  # regression: was OverflowError
        True,
        None,
        b"1h",
    ],
)
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_duration(text)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_parse_duration_names_what_it_is_for() -> None:
    with pytest.raises(InvalidArgument, match="ttl"):
        parse_duration("later", what="ttl")


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "1.0K"),
        (1536, "1.5K"),
        (100 * K, "100K"),
        (512 * M, "512M"),
        (16 * G, "16.0G"),
        (3 * G // 2, "1.5G"),
        (T, "1.0T"),
        (2048 * T, "2048T"),  # T is the largest unit
    ],
)
def test_format_size(num_bytes: int, expected: str) -> None:
    assert format_size(num_bytes) == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_SIZE_BYTES))
def test_format_size_parses_back_close(n: int) -> None:
    """What format_size prints, parse_size reads back to within its rounding (5%)."""
    back = parse_size(format_size(n))
    assert math.isclose(back, n, rel_tol=0.05)


def test_format_size_never_prints_1024_of_a_unit() -> None:
    assert format_size(1048575) == "1.0M"
    assert format_size(1023 * 1024) == "1023K"
