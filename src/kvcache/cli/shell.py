"""``kvcache completion SHELL`` and ``kvcache man``: generated from the parser itself, so
they list every command and option there is, and nothing else.

shtab writes the completion scripts and argparse-manpage the manual page (both small,
with no dependencies of their own, and imported only here).
"""

from __future__ import annotations

import argparse

from .. import __version__
from .output import Output
from .parser import build

_DESCRIPTION = "named LLM KV-cache pools in shared memory"


def completion(args: argparse.Namespace, out: Output) -> dict[str, object]:
    """Print the completion script for ``args.shell``, for the ``kvcache`` command."""
    import shtab

    out.raw(shtab.complete(build("kvcache"), shell=args.shell))
    return {}


def man(args: argparse.Namespace, out: Output) -> dict[str, object]:
    """Print the manual page of the ``kvcache`` command, in roff (``man -l -`` reads it)."""
    from argparse_manpage.manpage import Manpage

    page = Manpage(
        build("kvcache"),
        {"project_name": "kvcache", "version": __version__, "description": _DESCRIPTION},
    )
    out.raw(str(page))
    return {}
