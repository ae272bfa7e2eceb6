"""The command line over the kvcache Python API: ``kvcache COMMAND ...``.

- ``parser``: the grammar (every command with an example in ``--help``)
- ``commands``: the pool commands (create, list, status, ...), calling only public API;
  ``operations`` (stats, metrics, status --watch), ``simulating`` (simulate), ``shell``
  (completion, man) and ``llama_server`` hold the others
- ``output``: tables, progress bars and ``--json`` documents; ``terminal`` and ``bars``
  are its rich side

Two console scripts run the same commands, spelled here once: ``kvcache``
(``kvcache create ...``, also ``python -m kvcache``) and ``cortex``, the first
spelling, kept as an alias (``cortex cache create ...``). A command added to the
parser is there under both names. ``kvcache cache create ...`` is accepted too.

SIGINT and SIGTERM stop every command the same way, by an exception in the
main thread, so ``finally`` blocks run (a simulation kills its workers, an
exporter frees its port). We install both handlers ourselves: Python installs
none for SIGTERM (whose default kills at once, cleaning nothing), and none for
SIGINT in a process started with SIGINT ignored, as ``nohup cmd &`` and
background jobs of scripts are, which an exporter or a watch often is.

Exit codes: 0 on success; 2 on a command line that does not parse (an unknown
command or option, a missing or malformed argument: one line on stderr, as
argparse and click do); 1 on an error kvcache reports (one line on stderr, no
traceback) or when ``health`` finds problems it did not repair; 130 on Ctrl-C
(SIGINT), 143 on SIGTERM; 141 when the reader of the output went away
(``kvcache list | head -1``). The commands that run until stopped
(``metrics --serve``, ``status --watch``) exit 0 on either signal: that is how
they are meant to end.

Only the command line needs ``rich`` (a dependency of the package): inference
engines import the library without loading it, and the command line imports it
at the first line or table it shows (``terminal``), so a missing rich is a
one-line error there and a ``--json`` run never loads it.

A command imports what it uses and nothing more: the parser adds a command's
options only when that command is parsed, and each command's module is imported
when it runs (``COMMANDS``), so ``kvcache list`` loads neither simulate's process
pool nor the llama-server proxy's asyncio, and ``--version`` loads no pool code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from ..errors import KVCacheError
from .output import Output
from .parser import VERSION, UsageError, build

EXIT_READER_LEFT = 128 + 13
"""128 + SIGPIPE: what a shell reports for ``cat`` or ``ls`` stopped by ``| head``, so
``set -o pipefail`` scripts see kvcache the same way. (Python ignores SIGPIPE and raises
BrokenPipeError instead; dying of the signal would need the default handler restored.)"""

EXIT_USAGE = 2
"""A command line that does not parse (argparse's and click's code for it)."""

NEEDS_RICH = "the command line needs the rich package: pip install 'rich>=13'"
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_NEGATIVE = re.compile(r"-[\d.]")
"""A value such as ``-5G`` or ``-.5``: argparse takes it for an option unless it is a plain
number, so ``--size -5G`` would end in "expected one argument" instead of our message."""


COMMANDS = {
    "create": "commands.create",
    "list": "commands.list_pools",
    "status": "commands.status",
    "entries": "commands.entries",
    "health": "commands.health",
    "persist": "commands.persist",
    "restore": "commands.restore",
    "evict": "commands.evict",
    "destroy": "commands.destroy",
    "delete": "commands.destroy",
    "access-log": "commands.access_log",
    "policies": "commands.policies",
    "completion": "shell.completion",
    "man": "shell.man",
    "simulate": "simulating.simulate",
    "metrics": "operations.metrics",
    "stats": "operations.stats",
    "llama-server": "llama_server.llama_server",
}
"""The function each command runs, as ``module.function`` in this package (imported when
the command runs)."""


class Unhealthy(Exception):
    """``health`` found problems it did not repair: exit code 1 after the report."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a command ran (a ``KeyboardInterrupt``, so the
    commands that run until stopped catch both as they catch Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run(argv: list[str], prog: str = "kvcache") -> int:
    """Run one command (``create``, ``list``, ...) as ``prog`` would; return its exit code.

    Args:
        argv: the command and its arguments; a leading ``cache`` (the ``cortex cache``
            grammar) is accepted and dropped.
        prog: the name shown in messages and in ``--help``'s examples.
    """
    return _until_reader_leaves(lambda: _command(argv, prog))


def main(argv: list[str] | None = None) -> int:
    """The ``kvcache`` console script: ``kvcache COMMAND ...``."""
    return run(sys.argv[1:] if argv is None else argv, "kvcache")


def cortex(argv: list[str] | None = None) -> int:
    """The ``cortex`` console script, kvcache's first spelling: ``cortex cache COMMAND ...``."""
    argv = sys.argv[1:] if argv is None else argv
    return _until_reader_leaves(lambda: _cortex(argv))


def _command(argv: list[str], prog: str) -> int:
    if argv[:1] == ["cache"]:
        argv = argv[1:]
    return _run(_joined_negative_values(argv), prog)


def _joined_negative_values(argv: list[str]) -> list[str]:
    """``--size -5G`` as ``--size=-5G``, so the value reaches kvcache's own check.

    Nothing after ``--`` is touched: that belongs to another program (llama-server).
    """
    joined: list[str] = []
    for index, arg in enumerate(argv):
        if arg == "--":
            return joined + argv[index:]
        previous = joined[-1] if joined else ""
        if _NEGATIVE.match(arg) and previous.startswith("--") and "=" not in previous:
            joined[-1] = f"{previous}={arg}"
        else:
            joined.append(arg)
    return joined


def _load(name: str) -> Callable[[argparse.Namespace, Output], dict[str, object]]:
    """The function command ``name`` runs, its module imported now."""
    module, _, function = COMMANDS[name].partition(".")
    return getattr(importlib.import_module(f".{module}", __name__), function)  # type: ignore[no-any-return]


def _until_reader_leaves(command: Callable[[], int]) -> int:
    """``command()``, stopped quietly (exit status 141) if the reader of stdout went away."""
    try:
        try:
            return command()
        finally:  # also after --help's SystemExit: a reader that left is found here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        # Output still buffered goes to /dev/null, or the interpreter's flush at
        # exit would fail again (and print "Exception ignored ...").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_LEFT


def _run(argv: list[str], prog: str) -> int:
    try:
        args = build(prog, lazy=True).parse_args(argv)
        command = _load(args.command)
        out = Output(getattr(args, "json", False))
        with _stopped_by_signals():
            out.document(command(args, out))
        return 0
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KVCacheError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except Unhealthy:
        return 1
    except ModuleNotFoundError as exc:  # rich is imported at the first line or table shown
        if (exc.name or "").partition(".")[0] != "rich":
            raise
        print(f"{prog}: error: {NEEDS_RICH}", file=sys.stderr)
        return 1
    except PermissionError as exc:
        print(
            f"{prog}: error: permission denied ({exc.filename}): run as the pool's owner",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        how = "interrupted" if signum == signal.SIGINT else f"stopped by {exc}"
        print(f"{prog}: {how}", file=sys.stderr)
        return 128 + signum


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise :class:`Interrupted` in this
    thread; the previous handlers come back after it (``run`` is also called in-process,
    by tests and programs). Outside the main thread no handler can be set: nothing is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _interrupt) for signum in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _cortex(argv: list[str]) -> int:
    if argv[:1] == ["cache"]:
        return _command(argv[1:], "cortex cache")
    if argv[:1] == ["--version"]:
        print(VERSION)
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: cortex cache COMMAND ...\n\ngroups:\n  cache   manage kvcache pools")
        print("\ncortex is kvcache's first name; `kvcache COMMAND ...` runs the same commands.")
        print("\nexample:\n  cortex cache create llama-cache --size 16G   (cortex cache --help)")
        return 0 if argv else EXIT_USAGE
    print(
        f"cortex: error: unknown group {argv[0]!r}: the group is 'cache' (cortex cache --help)",
        file=sys.stderr,
    )
    return EXIT_USAGE
