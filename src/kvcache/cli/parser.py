"""The command line's grammar: every command, its options and an example."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .. import __version__

SHELLS = ("bash", "zsh", "tcsh")
"""The shells ``completion`` writes scripts for (those shtab supports)."""

VERSION = f"kvcache {__version__}"
"""What ``kvcache --version`` (and ``cortex --version``) print."""


class UsageError(Exception):
    """A command line that does not parse; reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """Reports a bad command line as :class:`UsageError`, and adds a command's options
    when it is first parsed or shown (``build(lazy=True)``)."""

    def __init__(
        self,
        *args: Any,
        options: Callable[[argparse.ArgumentParser], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._options = options

    def filled(self) -> _Parser:
        """This parser with its command's options added (once)."""
        options, self._options = self._options, None
        if options is not None:
            options(self)
        return self

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        return super(_Parser, self.filled()).parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        return super(_Parser, self.filled()).format_usage()

    def format_help(self) -> str:
        return super(_Parser, self.filled()).format_help()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")


def _force(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--force", action="store_true", help=text)


_MODE_FORCE = "allow a --mode that lets other users in (e.g. 666)"


def _remote(p: argparse.ArgumentParser) -> None:
    """``create``'s remote-tier options (see ``kvcache.remote``)."""
    p.add_argument(
        "--remote",
        metavar="URL",
        help="a Redis/Valkey server or cluster as the last tier, shared by every host with "
        "the same --namespace: redis://HOST:6379/0, rediss://, unix:///PATH, "
        "redis+cluster://H1:P1,H2:P2 (the password from $KVCACHE_REDIS_PASSWORD or "
        "--password-file, never in the URL)",
    )
    p.add_argument("--namespace", help="with --remote: the prefix of the remote keys")
    p.add_argument(
        "--write-through",
        action="store_true",
        help="with --remote: send every put to the remote at once (other hosts see it at "
        "once), not only what the local tiers evict",
    )
    p.add_argument(
        "--remote-timeout",
        metavar="DURATION",
        help="with --remote: a call slower than this marks it down (default 250ms)",
    )
    p.add_argument(
        "--password-file", metavar="FILE", help="with --remote: a file holding its password"
    )
    p.add_argument(
        "--remote-key-file",
        metavar="FILE",
        help="with --remote: a file holding the key (e.g. `openssl rand -hex 32`) that signs "
        "every record; hosts sharing the namespace use the same key, and a record that "
        "fails it is never served",
    )


def trust_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--trust-owner``/``--trust-group`` options as keyword arguments of the API."""
    return {"trust_owner": args.trust_owner, "trust_group": args.trust_group}


def _trust(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-owner",
        metavar="USER",
        help="also accept pools and snapshots of this user (default: only yours and root's)",
    )
    parser.add_argument(
        "--trust-group",
        action="store_true",
        help="also accept pools and snapshots whose group is one of yours",
    )


def build(prog: str, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The parser of every command, invoked as ``prog`` (``kvcache``, ``cortex cache``).

    The examples in ``--help`` are written with ``prog``, so each spelling shows its own.

    Args:
        prog: the command's name, shown in usage, errors and examples.
        lazy: add a command's options only when that command is parsed or its help shown
            (what a run needs: the options of ``simulate`` import ``kvcache.simulate`` for
            their defaults, which ``kvcache list`` has no use for). Tools that walk every
            option (completion, the manual page, tests) take the whole parser.
    """
    root = _Parser(
        prog=prog,
        description="Manage kvcache pools: LLM KV caches in shared memory.",
        epilog=f"example:\n  {prog} create llama-cache --size 16G",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=VERSION)
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(
        name: str,
        summary: str,
        example: str,
        options: Callable[[argparse.ArgumentParser], None],
        aliases: Sequence[str] = (),
    ) -> None:
        parser: _Parser = sub.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=f"example:\n  {prog} {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            aliases=aliases,
            options=options,
        )
        if not lazy:
            parser.filled()

    command("create", "create a pool", "create llama-cache --size 16G --prefix-cache", _create)
    command("list", "one line per pool", "list", _list)
    command("status", "all pools, or one in detail", "status llama-cache --watch", _status)
    command(
        "stats",
        "a pool's counters, latency and tokens by model; --reset zeroes them",
        "stats llama-cache --reset",
        _stats,
    )
    command(
        "metrics",
        "Prometheus metrics of every pool: printed once, served over HTTP, or written for "
        "node_exporter",
        "metrics --serve 127.0.0.1:9464",
        _metrics,
    )
    command(
        "entries", "list a pool's entries", "entries llama-cache --sort size --limit 20", _entries
    )
    command(
        "health", "check allocator, index and entries agree", "health llama-cache --repair", _health
    )
    command(
        "persist",
        "write a snapshot to disk",
        "persist llama-cache --path /var/lib/kvcache/llama.kvsnap",
        _persist,
    )
    command("restore", "recreate a pool from a snapshot", "restore llama-cache --replace", _restore)
    command("evict", "evict entries by the pool's policy", "evict llama-cache --percent 25", _evict)
    command("destroy", "remove a pool", "destroy llama-cache --yes", _destroy, aliases=["delete"])
    command(
        "access-log",
        "start or stop logging a pool's prefix requests, for every process using it",
        "access-log llama-cache /var/log/kvcache/llama.log --max-size 256M",
        _access_log,
    )
    command("policies", "the eviction policies and when to use each", "policies", _policies)
    command(
        "completion",
        "print the shell completion script of kvcache (bash, zsh or tcsh)",
        "completion bash > ~/.local/share/bash-completion/completions/kvcache",
        _completion,
    )
    command("man", "print kvcache's manual page (roff)", "man | man -l -", _man)
    command(
        "simulate",
        "replay a request trace per policy and pool size: which policy, how big a pool",
        "simulate trace.jsonl --capacity 1%,5%,10% --policy all --plot hits.png",
        _simulate,
    )
    command(
        "llama-server",
        "run llama-server behind a proxy that keeps its prompts warm in a pool",
        "llama-server --pool llama-cache --listen 127.0.0.1:8081 -- -m model.gguf -c 8192",
        _llama_server,
    )
    return root


def _create(p: argparse.ArgumentParser) -> None:
    from ..folders import TIERS
    from ..policies import POLICIES

    p.add_argument("name")
    p.add_argument(
        "--size",
        required=True,
        help="room for data: 16G (or 16Gi, 16GiB), 512M, 1.5G (binary units)",
    )
    p.add_argument(
        "--tier",
        default="cpu",
        choices=TIERS,
        help="where pages live: cpu (shared memory, default) or disk (a file in --path)",
    )
    p.add_argument(
        "--path",
        metavar="FOLDER",
        help="an existing folder for the pool's file (default /dev/shm for cpu, "
        "$KVCACHE_HOME/disk for disk)",
    )
    p.add_argument(
        "--policy",
        help=f"eviction policy: {', '.join(POLICIES)} (default prefix with --prefix-cache, "
        "else lru)",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="the pool is for PrefixCache (token-prefix KV chunks): its policy defaults to prefix",
    )
    p.add_argument(
        "--page-size", default="64K", help="allocation unit, power of two 1K-256M (default 64K)"
    )
    p.add_argument(
        "--max-entries", type=_positive_number, help="entry slots, 1 or more (default one per page)"
    )
    p.add_argument(
        "--inline-bytes",
        default=0,
        help="pack small values: each entry slot gets an inline slot of this many bytes "
        "(16-4K, a multiple of 16), where a value that fits with its key takes no page; "
        "allows more --max-entries than pages (default none)",
    )
    p.add_argument("--ttl", help="default expiry of entries: 90s, 15m, 1h (default never)")
    p.add_argument("--prealloc", action="store_true", help="reserve all memory now")
    p.add_argument(
        "--spill-to",
        metavar="POOL",
        help="an existing pool that evicted entries move to (e.g. a disk pool), not dropped",
    )
    p.add_argument(
        "--promote",
        default="hit",
        choices=["hit", "never"],
        help="with --spill-to: move an entry found below up into this pool (hit, the "
        "default) or read it where it is (never)",
    )
    _remote(p)
    p.add_argument(
        "--access-log",
        metavar="FILE",
        help="every process using the pool appends its prefix requests here, for simulate",
    )
    p.add_argument(
        "--access-log-size",
        metavar="SIZE",
        help="with --access-log: its cap, with its one rotated file (default 64M)",
    )
    p.add_argument(
        "--mode", default="600", help="octal permissions, e.g. 660 to share with a group"
    )
    _force(p, _MODE_FORCE)
    p.add_argument(
        "--restore", action="store_true", help="fill it from its snapshot, if there is one"
    )
    p.add_argument("--snapshot", help="snapshot for --restore (default: the pool's default path)")
    p.add_argument(
        "--exist-ok",
        action="store_true",
        help="if the pool exists already, leave it as it is and succeed (boot units)",
    )
    _trust(p)
    _json(p)


def _list(p: argparse.ArgumentParser) -> None:
    _trust(p)
    _json(p)


def _status(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?")
    p.add_argument(
        "--watch",
        action="store_true",
        help="show hits, misses, MB/s in and out, evictions per second, live (a line per "
        "interval when piped)",
    )
    p.add_argument(
        "--interval", default="1s", help="with --watch: seconds between lines (default 1s)"
    )
    p.add_argument(
        "--count", type=_positive_number, help="with --watch: stop after N lines (default never)"
    )
    _trust(p)
    _json(p)


def _stats(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--reset", action="store_true", help="then zero every counter (all processes)")
    _trust(p)
    _json(p)


def _metrics(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--serve",
        metavar="HOST:PORT",
        help="serve /metrics over HTTP until stopped (host default 127.0.0.1: only this "
        "machine; give 0.0.0.0:9464 to let others scrape)",
    )
    where.add_argument(
        "--textfile",
        metavar="PATH",
        help="write them to PATH atomically, for node_exporter's textfile collector",
    )
    where.add_argument(
        "--json",
        action="store_true",
        help="print them once as one JSON document (for scripts)",
    )
    p.add_argument(
        "--pool",
        action="append",
        metavar="NAME",
        help="only this pool (repeat for more; default every pool on the machine)",
    )
    _trust(p)


def _entries(p: argparse.ArgumentParser) -> None:
    from ..pool import ENTRY_SORTS

    p.add_argument("name")
    p.add_argument(
        "--sort", default="lru", choices=ENTRY_SORTS, help="order (default lru: least recent first)"
    )
    p.add_argument(
        "--limit", type=_whole_number, default=50, help="at most N entries (default 50, 0 = all)"
    )
    _trust(p)
    _json(p)


def _health(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--repair", action="store_true", help="rebuild what is inconsistent")
    _trust(p)
    _json(p)


def _persist(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument(
        "--path", help="snapshot file (default $KVCACHE_HOME or ~/.local/share/kvcache/NAME.kvsnap)"
    )
    _trust(p)
    _json(p)


def _restore(p: argparse.ArgumentParser) -> None:
    from ..folders import TIERS

    p.add_argument("name")
    p.add_argument("--path", help="snapshot file (default: the pool's default path)")
    p.add_argument("--replace", action="store_true", help="replace the pool if it exists")
    p.add_argument(
        "--tier", choices=TIERS, help="cpu or disk (default: the replaced pool's, else cpu)"
    )
    p.add_argument(
        "--folder", help="folder for the pool's file (as create --path; default by --tier)"
    )
    p.add_argument(
        "--size", help="a different pool size (if smaller, the policy decides what stays)"
    )
    p.add_argument("--mode", help="octal permissions, e.g. 660 (default: the snapshot's)")
    _force(
        p,
        f"{_MODE_FORCE}, and --replace a pool other processes have open (their next call fails)",
    )
    _trust(p)
    _json(p)


def _evict(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--percent", type=float, help="share of the used bytes to free, (0, 100]")
    target.add_argument("--bytes", help="bytes to free: 2G, 512M")
    target.add_argument("--expired", action="store_true", help="only remove expired entries")
    _trust(p)
    _json(p)


def _destroy(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    _force(p, "destroy it even while other processes have it open (their next call fails)")
    _trust(p)
    _json(p)


def _access_log(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument("file", nargs="?", help="the log (appended to; FILE.1 after rotation)")
    p.add_argument("--max-size", help="its cap, with its one rotated file (default 64M)")
    p.add_argument("--off", action="store_true", help="stop logging")
    _trust(p)
    _json(p)


def _policies(p: argparse.ArgumentParser) -> None:
    _json(p)


def _completion(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to complete kvcache's commands in")


def _man(p: argparse.ArgumentParser) -> None:
    """No options: the page is of the ``kvcache`` command."""


def _simulate(p: argparse.ArgumentParser) -> None:
    from ..policies import POLICIES
    from ..simulate import DEFAULT_CAPACITIES, DEFAULT_PREFILL_TOKENS_PER_S
    from ..simulate.traces import MOONCAKE_BLOCK_TOKENS

    p.add_argument(
        "trace",
        help="a Mooncake JSONL trace (one request per line with hash_ids), or a pool's "
        "access log (create --access-log); - reads it from stdin",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--capacity",
        help="pool capacities: shares of the trace's distinct blocks or block counts "
        f"(default {','.join(DEFAULT_CAPACITIES)})".replace("%", "%%"),  # argparse %-formats help
    )
    size.add_argument(
        "--size", help="pool sizes, e.g. 16G,64G (blocks of --block-tokens x --kv-bytes-per-token)"
    )
    p.add_argument(
        "--kv-bytes-per-token",
        help="with --size: the model's KV bytes per token (default: an access log's own, "
        "else 128K: Llama-3-8B in fp16)",
    )
    p.add_argument(
        "--block-tokens",
        type=_positive_number,
        help="tokens per trace block (default: an access log's chunk size, else "
        f"{MOONCAKE_BLOCK_TOKENS}, Mooncake's)",
    )
    p.add_argument(
        "--policy", default="all", help=f"policies, comma-separated: {', '.join(POLICIES)} or all"
    )
    p.add_argument(
        "--prefill-rate",
        type=_positive_number,
        default=DEFAULT_PREFILL_TOKENS_PER_S,
        metavar="TOKENS_PER_S",
        help="prefill speed the saved time is reckoned at "
        f"(default {DEFAULT_PREFILL_TOKENS_PER_S})",
    )
    p.add_argument(
        "--samples", type=_positive_number, default=64, help="eviction samples (default 64)"
    )
    p.add_argument("--requests", type=_positive_number, help="only the first N requests")
    p.add_argument(
        "--jobs", type=_positive_number, help="replays run at once (default: one per CPU)"
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw hit ratio against capacity")
    size.add_argument(
        "--sweep",
        action="store_true",
        help="capacities from 0.5%% to 50%% in one run: a curve per policy, its knee and "
        "(with --target-hit) the size to buy",
    )
    p.add_argument(
        "--target-hit",
        type=_percent,
        metavar="PERCENT",
        help="with --sweep: the block hit ratio to size the pool for, e.g. 20%%",
    )
    _json(p)


def _llama_server(p: argparse.ArgumentParser) -> None:
    """The proxy (``kvcache.integrations.llama_server``, docs/llama-server.md)."""
    p.add_argument("--pool", required=True, help="the pool slot states are kept in")
    p.add_argument("--listen", default="127.0.0.1:8081", help="HOST:PORT clients use")
    p.add_argument("--upstream", help="front a running llama-server at this URL instead")
    p.add_argument("--slot-dir", help="with --upstream: its --slot-save-path (mode 700, yours)")
    p.add_argument("--server-bin", help="the llama-server to start (default: beside Python)")
    p.add_argument("--model", help="the GGUF file, if /props' model_path is not readable here")
    p.add_argument(
        "--chunk-tokens", type=_positive_number, default=256, help="tokens per key (default 256)"
    )
    p.add_argument(
        "--max-waiting",
        type=_whole_number,
        default=64,
        help="requests that may wait for a slot; more run uncached (default 64)",
    )
    p.add_argument(
        "server_args",
        nargs=argparse.REMAINDER,
        help="after --: llama-server's options (with --upstream: the ones it runs with)",
    )


def _percent(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage, e.g. 20%") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0% and at most 100%")
    return value / 100


def _whole_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def _positive_number(text: str) -> int:
    value = _whole_number(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value
