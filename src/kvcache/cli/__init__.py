"""``cortex cache``: the command line over the kvcache Python API.

- ``parser``: the grammar (every command with an example in ``--help``)
- ``commands``: one function per command, calling only public API
- ``output``: tables, progress bars and ``--json`` documents

Exit codes: 0 on success; 1 on a user error (one line on stderr, no
traceback) or when ``health`` finds problems it did not repair; 130 on Ctrl-C.

Only the command line needs ``rich`` (the ``cli`` extra): inference engines
import the library without it, so ``commands`` and ``output`` are imported
when a command runs, and a missing rich is a one-line error there.
"""

from __future__ import annotations

import sys

from ..errors import KVCacheError
from .parser import UsageError, build

NEEDS_RICH = "the command line needs the rich package: pip install 'kvcache[cli]'"


def run(argv: list[str], prog: str = "cortex cache") -> int:
    """Run one ``cache`` command; return its exit code."""
    try:
        from .commands import COMMANDS, Unhealthy
        from .output import Output
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "rich":
            raise
        print(f"{prog}: error: {NEEDS_RICH}", file=sys.stderr)
        return 1
    try:
        args = build(prog).parse_args(argv)
        out = Output(getattr(args, "json", False))
        out.document(COMMANDS[args.command](args, out))
        return 0
    except (UsageError, KVCacheError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except Unhealthy:
        return 1
    except PermissionError as exc:
        print(
            f"{prog}: error: permission denied ({exc.filename}): run as the pool's owner",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    """The ``cortex`` console script: ``cortex cache COMMAND ...``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: cortex cache COMMAND ...\n\ngroups:\n  cache   manage kvcache pools")
        print("\nexample:\n  cortex cache create llama-cache --size 16G   (cortex cache --help)")
        return 0 if argv else 1
    if argv[0] != "cache":
        print(
            f"cortex: error: unknown group {argv[0]!r}: the group is 'cache' (cortex cache --help)",
            file=sys.stderr,
        )
        return 1
    return run(argv[1:])
