"""The progress bar of ``persist``, ``restore`` and ``simulate``, imported when one is shown
(``rich.progress`` is not needed by the commands that show none)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

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
from rich.text import Text

from ..units import format_size

if TYPE_CHECKING:
    from ..snapshot import Progress as ProgressCallback


@contextmanager
def progress_bar(console: Console, description: str, counting: bool) -> Iterator[ProgressCallback]:
    """A bar labelled ``description`` showing bytes and bytes/s in kvcache's units (items
    when ``counting``); yields the callback that moves it (done, total)."""
    amounts = (MofNCompleteColumn(),) if counting else (_BytesColumn(), _RateColumn())
    columns = (TextColumn("{task.description}"), BarColumn(), *amounts, TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
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
