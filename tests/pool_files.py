"""Writes into a closed pool's file, for tests of what another kvcache would make of it."""

from __future__ import annotations

from pathlib import Path

from kvcache.layout import H


def set_format_version(path: str | Path, version: int) -> None:
    """Write ``version`` into the header's format word, as a kvcache of that format would."""
    with open(path, "r+b") as f:
        f.seek(H.format_version * 8)
        f.write(version.to_bytes(8, "little"))
