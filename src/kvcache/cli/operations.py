"""The operators' commands: ``metrics`` (Prometheus), ``stats`` (counters, ``--reset``) and
``status NAME --watch`` (per-interval rates, like ``redis-cli --stat``)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

import kvcache

from ..errors import InvalidArgument
from ..reports import PoolStats, Rates
from ..units import format_size, parse_duration
from .output import Output
from .parser import trust_kwargs

if TYPE_CHECKING:
    from rich.live import Live

NEEDS_PROMETHEUS = (
    "kvcache metrics needs the prometheus_client package: pip install 'kvcache[metrics]'"
)
WATCH_COLUMNS = (
    "TIME",
    "HITS/S",
    "MISSES/S",
    "PUTS/S",
    "IN-MB/S",
    "OUT-MB/S",
    "EVICT/S",
    "USED",
    "PROCS",
)
HEADER_EVERY = 20
"""A piped ``--watch`` repeats its column header this often (as ``redis-cli --stat``)."""


def metrics(args: argparse.Namespace, out: Output) -> dict[str, object]:
    try:
        from .. import metrics as exporter
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "prometheus_client":
            raise
        raise InvalidArgument(NEEDS_PROMETHEUS) from None
    trust = {**trust_kwargs(args), "pools": args.pool or ()}
    if args.textfile is not None:
        exporter.write_textfile(args.textfile, **trust)
        return {"textfile": args.textfile}
    if out.as_json:
        return {"metrics": _families(exporter.registry(**trust))}
    if args.serve is None:
        sys.stdout.write(exporter.exposition(**trust))
        return {}
    host, port = exporter.parse_address(args.serve)
    server = exporter.Server(host, port, **trust)
    try:  # from here a signal is the way to stop, even one sent on seeing the line below
        shown = f"[{server.host}]" if ":" in server.host else server.host
        print(f"serving http://{shown}:{server.port}/metrics (Ctrl-C or SIGTERM stops)", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return {}


def _families(registry: Any) -> list[dict[str, object]]:
    """``metrics --json``: each metric family of the exposition, with its samples."""
    return [
        {
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            "samples": [
                {"name": s.name, "labels": s.labels, "value": s.value} for s in family.samples
            ],
        }
        for family in registry.collect()
    ]


def stats(args: argparse.Namespace, out: Output) -> dict[str, object]:
    with kvcache.open(args.name, chain=False, observe=True, **trust_kwargs(args)) as pool:
        counters, measured = pool.stats(), pool.metrics()
        if args.reset:
            pool.reset_stats()
    doc: dict[str, Any] = {
        **{name: value for name, value in counters.to_dict().items() if name != "attached"},
        "latency": {
            op: {
                "count": h.count,
                "mean_s": h.mean_s,
                "p50_s": h.quantile(0.5),
                "p99_s": h.quantile(0.99),
            }
            for op, h in measured.latency.items()
        },
        "tokens": {model: vars(t) for model, t in measured.tokens.items()},
        "reset_at": measured.reset_at,
        "reset": bool(args.reset),
    }
    out.table(("COUNTER", "VALUE"), _counter_rows(counters), right=("VALUE",))
    out.table(
        ("OP", "SAMPLES", "MEAN", "P50 <=", "P99 <="),
        [
            (op, v["count"], _ms(v["mean_s"]), _ms(v["p50_s"]), _ms(v["p99_s"]))
            for op, v in doc["latency"].items()
        ],
        right=("SAMPLES", "MEAN", "P50 <=", "P99 <="),
    )
    if measured.tokens:
        out.table(
            ("MODEL", "QUERIED", "HIT", "HIT-RATE", "STORED"),
            [
                (m, t.queried, t.hit, f"{t.hit / t.queried:.1%}" if t.queried else "-", t.stored)
                for m, t in measured.tokens.items()
            ],
            right=("QUERIED", "HIT", "HIT-RATE", "STORED"),
        )
    if args.reset:
        out.line(f"counters of pool '{args.name}' reset")
    return doc


def _counter_rows(s: PoolStats) -> list[tuple[str, object]]:
    return [
        ("hits / misses", f"{s.hits} / {s.misses} ({s.hit_rate:.1%} hit rate)"),
        ("puts", s.puts),
        ("bytes in / out", f"{format_size(s.bytes_in)} / {format_size(s.bytes_out)}"),
        ("evictions: capacity", s.evictions - s.evictions_explicit),
        ("evictions: expiry", s.expirations),
        ("evictions: explicit", s.evictions_explicit),
        ("spills / promotions", f"{s.spills} / {s.promotions}"),
        ("errors / damaged / repairs", f"{s.errors} / {s.damaged} / {s.repairs}"),
    ]


def _ms(seconds: float) -> str:
    return "-" if not seconds else "inf" if seconds == float("inf") else f"{seconds * 1e3:.3f} ms"


def watch(args: argparse.Namespace, out: Output) -> dict[str, object]:
    """``status NAME --watch``: one row of rates per interval, until Ctrl-C or ``--count``."""
    if out.as_json:
        raise InvalidArgument("--watch prints a line per interval: leave out --json")
    interval_s = parse_duration(args.interval, what="--interval")
    if not interval_s > 0:
        raise InvalidArgument(f"--interval must be more than 0, not {args.interval!r}")
    with kvcache.open(args.name, chain=False, observe=True, **trust_kwargs(args)) as pool:
        try:
            if not out.interactive:
                _watch_loop(pool, interval_s, args.count, _piped_line(out))
                return {}
            from rich.live import Live  # rich only on a terminal (as in output)

            with Live(console=out.console, auto_refresh=False) as live:
                height = max(5, out.console.size.height - 4)
                _watch_loop(pool, interval_s, args.count, _live_table(live, height))
        except KeyboardInterrupt:
            pass  # the usual way to stop watching
    return {}


def _watch_loop(pool: kvcache.Pool, interval_s: float, count: int | None, show: Any) -> None:
    before, then = pool.stats(), time.monotonic()
    shown = 0
    while count is None or shown < count:
        time.sleep(max(0.0, then + interval_s - time.monotonic()))
        after, now = pool.stats(), time.monotonic()
        show(_row(Rates.between(before, after, now - then)))
        before, then, shown = after, now, shown + 1


def _row(r: Rates) -> tuple[str, ...]:
    return (
        time.strftime("%H:%M:%S"),
        f"{r.hits_per_s:.1f}",
        f"{r.misses_per_s:.1f}",
        f"{r.puts_per_s:.1f}",
        f"{r.in_bytes_per_s / 1e6:.2f}",
        f"{r.out_bytes_per_s / 1e6:.2f}",
        f"{r.evictions_per_s:.1f}",
        format_size(r.used_bytes),
        str(r.num_attached),
    )


def _piped_line(out: Output) -> Any:
    widths = [max(len(c), 10) for c in WATCH_COLUMNS]
    printed = 0

    def show(row: tuple[str, ...]) -> None:
        nonlocal printed
        if printed % HEADER_EVERY == 0:
            out.line("  ".join(c.rjust(w) for c, w in zip(WATCH_COLUMNS, widths, strict=True)))
        out.line("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
        out.console.file.flush()
        printed += 1

    return show


def _live_table(live: Live, visible: int) -> Any:
    from rich.table import Table

    rows: list[tuple[str, ...]] = []

    def show(row: tuple[str, ...]) -> None:
        rows.append(row)
        del rows[:-visible]
        table = Table(box=None, header_style="bold", pad_edge=False)
        for column in WATCH_COLUMNS:
            table.add_column(column, justify="left" if column == "TIME" else "right")
        for each in rows:
            table.add_row(*each)
        live.update(table, refresh=True)

    return show
