"""rich's console, made by ``output`` on the first line or table it shows: a ``--json``
run never loads rich (about 20 ms of a command's start)."""

from __future__ import annotations

from rich.console import Console


class Terminal(Console):
    """rich's console, leaving a reader that went away to ``cli.run``."""

    def on_broken_pipe(self) -> None:
        # rich would exit with status 1 here; cli.run handles a reader that left
        # once, for tables and JSON alike (exit status 141).
        raise BrokenPipeError
