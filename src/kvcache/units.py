"""Human sizes (``16G``, ``1.5G``, ``64K``) and durations (``90s``, ``1h``) in and out.

Sizes use binary units, as memory does: ``1K`` is 1024 bytes, and so are
``1Ki``, ``1KiB`` and ``1KB`` (people write all four for memory; none means
1000 here). A bare number is bytes (or seconds). Anything empty, negative,
zero, non-numeric or absurd is an :class:`~kvcache.errors.InvalidArgument`
that shows an accepted example.
"""

from __future__ import annotations

import math
import re

from .errors import InvalidArgument

_SIZE_UNITS = {"": 1, "B": 1} | {
    letter + suffix: 1 << (10 * power)
    for power, letter in enumerate("KMGTP", start=1)
    for suffix in ("", "I", "B", "IB")
}
"""Upper-cased spellings: ``K``, ``Ki``, ``KB``, ``KiB`` ... ``P``, ``Pi``, ``PB``, ``PiB``."""
_DURATION_UNITS = {"": 1, "MS": 0.001, "S": 1, "M": 60, "H": 3600, "D": 86400}
_NUMBER_WITH_UNIT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")

MAX_SIZE_BYTES = 1 << 50
"""1 PiB: larger sizes are typos (a missing unit letter is the usual one), not plans."""


def parse_size(text: str | float, *, what: str = "size") -> int:
    """Parse a size such as ``16G``, ``512M``, ``1.5G``, ``4096`` or ``64K`` into bytes.

    Args:
        text: the size; a number is taken as bytes.
        what: what the size is for, named in the error message.

    Returns:
        The size in bytes, at least 1.

    Raises:
        InvalidArgument: empty, negative, zero, non-numeric or absurd sizes.
    """
    if isinstance(text, bool):
        raise InvalidArgument(f"{what} must be a size such as 16G or 512M, not {text!r}")
    if isinstance(text, int):
        size = text  # exact: never through float, so 10**400 is absurd, not an OverflowError
    elif isinstance(text, float):
        size = math.floor(text) if math.isfinite(text) else -1
    else:
        number, unit = _split(text, what, "16G, 512M, 1.5G, 64K or 4096")
        if unit.upper() not in _SIZE_UNITS:
            raise InvalidArgument(
                f"{what} {text!r} has an unknown unit {unit!r}: "
                "use K, M, G, T (binary; Gi, GiB and GB mean G too) or none"
            )
        scaled = (
            number * _SIZE_UNITS[unit.upper()]
        )  # inf for 400 digits: absurd, not an OverflowError
        size = math.floor(scaled) if math.isfinite(scaled) else MAX_SIZE_BYTES + 1
    if size <= 0:
        raise InvalidArgument(f"{what} must be positive, got {text!r}: use e.g. 16G or 512M")
    if size > MAX_SIZE_BYTES:
        raise InvalidArgument(f"{what} {text!r} is absurdly large (over 1P): check the unit")
    return size


def parse_duration(text: str | float | int, *, what: str = "duration") -> float:
    """Parse a duration such as ``90``, ``90s``, ``15m``, ``1h`` or ``2d`` into seconds (> 0)."""
    if isinstance(text, bool):
        raise InvalidArgument(f"{what} must be a duration such as 90s or 1h, not {text!r}")
    if isinstance(text, (int, float)):
        try:
            seconds = float(text)
        except OverflowError:  # an int beyond float range (10**400): absurd, rejected below
            seconds = math.inf
    else:
        number, unit = _split(text, what, "90s, 15m, 1h or 2d")
        if unit.upper() not in _DURATION_UNITS:
            raise InvalidArgument(
                f"{what} {text!r} has an unknown unit {unit!r}: use ms, s, m, h or d"
            )
        seconds = number * _DURATION_UNITS[unit.upper()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(
            f"{what} must be a positive duration, got {text!r}: use e.g. 90s or 1h"
        )
    return seconds


def whole_number(value: object, what: str, low: int = 0, high: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) from ``low`` to ``high``.

    Raises:
        InvalidArgument: naming ``what`` and the accepted range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        accepted = f">= {low}" if high is None else f"from {low} to {high}"
        raise InvalidArgument(f"{what} must be a whole number {accepted}, not {value!r}")
    return value


def format_size(num_bytes: int | float) -> str:
    """Render bytes the way people read them: ``16.0G``, ``512M``, ``4.0K``, ``100B``."""
    value = float(num_bytes)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1023.95 or unit == "T":  # 1023.96K would print as "1024K"
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)}B"
    return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"


def _split(text: str, what: str, examples: str) -> tuple[float, str]:
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be text or a number, not {type(text).__name__}")
    if text.lstrip().startswith("-"):
        raise InvalidArgument(f"{what} {text!r} is negative: use e.g. {examples}")
    match = _NUMBER_WITH_UNIT.match(text)
    if match is None:
        raise InvalidArgument(f"{what} {text!r} is not understood: use e.g. {examples}")
    return float(match.group(1)), match.group(2)
