"""Where command results go: aligned tables and sizes for people, one JSON document for scripts.

rich is imported on the first line, table or bar shown (``terminal``): a ``--json`` run
prints with the standard library alone, which saves about 20 ms of its start.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from ..snapshot import Progress as ProgressCallback

SCHEMA_VERSION = 1
"""The ``"schema"`` of every ``--json`` document: raised when a field changes meaning or
goes away (a new field keeps it). The shapes are JSON Schema files in ``kvcache/schemas``."""


class Output:
    """Prints human output unless ``--json`` was given; JSON is printed once, at the end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.interactive = sys.stdout.isatty() and not as_json

    @cached_property
    def console(self) -> Console:
        """rich's console, made on first use (a ``--json`` run needs none)."""
        from .terminal import Terminal

        # no emoji codes: ":smile:" in a pool's name or a path is text like the rest
        return Terminal(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)

    def line(self, text: str) -> None:
        """A line of human output, never wrapped (a path in it stays whole)."""
        if not self.as_json:
            self.console.print(text, markup=False, soft_wrap=True)

    def raw(self, text: str) -> None:
        """Text printed as it is (a script, a manual page): no markup, no wrapping."""
        print(text, end="" if text.endswith("\n") else "\n")

    def table(
        self, columns: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()
    ) -> None:
        """An aligned table; ``right`` names the columns to right-align (numbers).

        On a terminal too narrow for it, headers stack their words on lines of their own
        and text columns wrap at spaces, rather than cut values short (rich's default
        ends a cut value with "..."); numbers never wrap.
        """
        if self.as_json:
            return
        from rich.table import Table
        from rich.text import Text

        cells = [[str(cell) for cell in row] for row in rows]
        widest = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
        stacked = sum(widest) + 2 * (len(columns) - 1) > self.console.width
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in columns:
            table.add_column(
                column.replace(" ", "\n") if stacked else column,
                justify="right" if column in right else "left",
                no_wrap=column in right,
                overflow="fold",
            )
        for row in cells:  # as Text: a key such as "[red]" or ":smile:" is shown as it is
            table.add_row(*(Text(cell) for cell in row))
        self.console.print(table)

    def document(self, doc: dict[str, object]) -> None:
        """The JSON document of a ``--json`` run, with its ``"schema"`` version."""
        if self.as_json:
            doc = {"schema": SCHEMA_VERSION, **doc}
            print(json.dumps(doc, indent=2, sort_keys=True, default=str))

    @contextmanager
    def progress(
        self, description: str, counting: bool = False
    ) -> Iterator[ProgressCallback | None]:
        """A progress bar on a terminal (a callback taking done/total bytes, or items when
        ``counting``); None otherwise."""
        if not self.interactive:
            yield None
            return
        from .bars import progress_bar

        with progress_bar(self.console, description, counting) as update:
            yield update
