"""Where command results go: aligned tables and sizes for people, one JSON document for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ..snapshot import Progress as ProgressCallback
from ..units import format_size

SCHEMA_VERSION = 1
"""The ``"schema"`` of every ``--json`` document: raised when a field changes meaning or
goes away (a new field keeps it). The shapes are JSON Schema files in ``kvcache/schemas``."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit with status 1 here; cli.run handles a reader that left
        # once, for tables and JSON alike (exit status 141).
        raise BrokenPipeError


class Output:
    """Prints human output unless ``--json`` was given; JSON is printed once, at the end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        interactive = sys.stdout.isatty()
        self.console = _Console(highlight=False, width=None if interactive else 160)
        self.interactive = interactive and not as_json

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
        for row in cells:
            table.add_row(*row)
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
        amounts = (MofNCompleteColumn(),) if counting else (_BytesColumn(), _RateColumn())
        columns = (TextColumn("{task.description}"), BarColumn(), *amounts, TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield update


class _BytesColumn(ProgressColumn):
    """Bytes done of the total, in the units of every other size shown (``24.8M``)."""

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else format_size(int(task.total))
        return Text(f"{format_size(int(task.completed))} / {total}")


class _RateColumn(ProgressColumn):
    """Bytes per second, in the same units (``1.2G/s``)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{format_size(int(speed))}/s")
