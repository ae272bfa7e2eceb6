"""Where command results go: aligned tables and sizes for people, one JSON document for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ..snapshot import Progress as ProgressCallback


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
        """A line of human output."""
        if not self.as_json:
            self.console.print(text, markup=False)

    def table(
        self, columns: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()
    ) -> None:
        """An aligned table; ``right`` names the columns to right-align (numbers)."""
        if self.as_json:
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in columns:
            table.add_column(column, justify="right" if column in right else "left", no_wrap=True)
        for row in rows:
            table.add_row(*(str(cell) for cell in row))
        self.console.print(table)

    def document(self, doc: object) -> None:
        """The JSON document of a ``--json`` run."""
        if self.as_json:
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
        amounts = (
            (MofNCompleteColumn(),)
            if counting
            else (DownloadColumn(binary_units=True), TransferSpeedColumn())
        )
        columns = (BarColumn(), *amounts, TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield update
