"""``kvcache simulate``: replay a trace per policy and capacity, with OPT as the ceiling."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .. import simulate as sim
from ..errors import DependencyError, InvalidArgument
from ..units import format_size, parse_size
from .output import Output

DEFAULT_KV_BYTES_PER_TOKEN = 128 << 10
"""Llama-3-8B in fp16: 32 layers x 2 x 8 KV heads x 128 x 2 bytes."""
NEEDS_MATPLOTLIB = "--plot needs matplotlib: pip install 'kvcache[plot]'"


def simulate(args: argparse.Namespace, out: Output) -> dict[str, object]:
    plotter = _pyplot(args.plot) if args.plot else None  # before minutes of replay, not after
    trace = sim.read_trace(args.trace, args.block_tokens)
    if args.requests:
        trace = trace.head(args.requests)
    if args.kv_bytes_per_token is not None:
        per_token = parse_size(args.kv_bytes_per_token, what="KV bytes per token")
        block_bytes = trace.block_tokens * per_token
    else:  # an access log knows its chunks' bytes; a Mooncake trace gets Llama-3-8B's
        block_bytes = trace.block_bytes or trace.block_tokens * DEFAULT_KV_BYTES_PER_TOKEN
    if args.target_hit is not None and not args.sweep:
        raise InvalidArgument("--target-hit sizes a pool from a sweep: add --sweep")
    shares = sim.SWEEP_SHARES if args.sweep else sim.DEFAULT_CAPACITIES
    capacities = sim.capacities_in_blocks(
        trace,
        _listed(args.capacity) if args.capacity else () if args.size else shares,
        _listed(args.size) if args.size else (),
        block_bytes,
    )
    runs = sim.runs_for(sim.policies_named(_listed(args.policy)), capacities, args.samples)
    out.line(
        f"trace {trace.name}: {trace.num_requests:,} requests, {trace.num_reads:,} block reads, "
        f"{trace.num_distinct:,} distinct blocks of {trace.block_tokens} tokens; "
        f"{len(runs)} replays"
    )
    with out.progress("replaying", counting=True) as progress:
        outcomes = sim.execute(trace, runs, args.jobs, progress)
    out.table(
        (
            "CAPACITY",
            "POLICY",
            "BLOCK HITS",
            "OF OPT",
            "PREFIX-HIT TOKENS",
            "PREFILL SAVED",
            "EVICTIONS",
        ),
        _rows(outcomes, trace, block_bytes, args.prefill_rate),
        right=("BLOCK HITS", "OF OPT", "PREFIX-HIT TOKENS", "PREFILL SAVED", "EVICTIONS"),
    )
    out.table(
        ("BLOCKS", "POLICY", "EVICTED, ASKED AGAIN", "HALF WITHIN"),
        [row for o in outcomes if (row := _regret(o))],
        right=("BLOCKS", "EVICTED, ASKED AGAIN", "HALF WITHIN"),
    )
    out.line(
        "eviction regret: of the evicted blocks sampled, the share asked for again, and the "
        "accesses (puts and hits) after their eviction by which half of those were"
    )
    out.line(
        f"prefill saved is reckoned at {args.prefill_rate:,} tokens/s (--prefill-rate); "
        "opt is Belady's offline optimum, the most any policy could reuse"
    )
    sweep = _sweep(out, outcomes, trace, block_bytes, args.target_hit) if args.sweep else None
    if plotter is not None:
        _plot(plotter, outcomes, trace, args.plot)
        out.line(f"plot written to {args.plot}")
    return {
        "trace": {
            "name": trace.name,
            "requests": trace.num_requests,
            "block_reads": trace.num_reads,
            "distinct_blocks": trace.num_distinct,
            "block_tokens": trace.block_tokens,
        },
        "block_bytes": block_bytes,
        "prefill_tokens_per_s": args.prefill_rate,
        "results": [
            {**o.as_dict(), "saved_seconds": o.saved_seconds(args.prefill_rate)} for o in outcomes
        ],
        **({"sweep": sweep} if sweep is not None else {}),
    }


def _sweep(
    out: Output,
    outcomes: Sequence[sim.Outcome],
    trace: sim.Trace,
    block_bytes: int,
    target: float | None,
) -> list[dict[str, object]]:
    """Print each policy's knee (and the size to buy for ``target``); the same as JSON."""

    def capacity(blocks: float) -> str:
        share = blocks / trace.num_distinct
        return f"{blocks:,.0f} blocks ({share:.1%}, {format_size(int(blocks * block_bytes))})"

    rows: list[tuple[object, ...]] = []
    report: list[dict[str, object]] = []
    for curve in sim.curves(outcomes):
        knee, size = curve.knee(), curve.size_for(target) if target is not None else None
        rows.append(
            (
                curve.policy,
                capacity(knee) if knee else "-",
                capacity(size) if size else ("not within 50%" if target is not None else "-"),
            )
        )
        report.append({"policy": curve.policy, "knee_blocks": knee, "target_blocks": size})
    target_title = f"SIZE FOR {target:.1%} HITS" if target is not None else "SIZE FOR A TARGET"
    out.table(("POLICY", "KNEE", target_title), rows)
    out.line(
        "knee: past it, each doubling of the pool buys less than the curve's average "
        "(give --target-hit to size for a hit ratio)"
    )
    return report


def _listed(text: str) -> list[str]:
    return [part for part in text.split(",") if part.strip()]


def _rows(
    outcomes: Sequence[sim.Outcome], trace: sim.Trace, block_bytes: int, rate: int
) -> list[tuple[object, ...]]:
    best = {o.capacity_blocks: o for o in outcomes if o.policy == sim.OPTIMAL}
    rows: list[tuple[object, ...]] = []
    for o in outcomes:
        ceiling = best[o.capacity_blocks].block_hits
        capacity = (
            f"{o.capacity_blocks:,} blocks ({o.capacity_blocks / trace.num_distinct:.1%}, "
            f"{format_size(o.capacity_blocks * block_bytes)})"
        )
        rows.append(
            (
                capacity if o.policy == sim.OPTIMAL else "",
                o.policy,
                f"{o.hit_ratio:.2%}",
                f"{o.block_hits / ceiling:.0%}" if ceiling else "-",
                f"{o.hit_tokens:,} ({o.token_ratio:.1%})",
                f"{o.saved_seconds(rate):,.0f} s",
                f"{o.evictions:,}",
            )
        )
    return rows


def _regret(o: sim.Outcome) -> tuple[object, ...] | None:
    """A row of eviction regret: of the evicted blocks sampled, the share asked for again,
    and the accesses by which half of those were (None for OPT)."""
    summary = o.regret_summary()
    if summary is None:
        return None
    after = summary["p50_accesses"] if summary["asked_again"] else None
    return (
        f"{o.capacity_blocks:,}",
        o.policy,
        f"{summary['share_asked_again']:.0%}",
        f"{after:,.0f} accesses" if after is not None else "-",
    )


def _pyplot(path: str) -> object:
    """matplotlib's pyplot, once it is known that it can write ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # a file, never a window
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise DependencyError(NEEDS_MATPLOTLIB) from None
    kinds = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    kind = Path(path).suffix.lstrip(".").lower()
    if kind not in kinds:
        raise InvalidArgument(
            f"--plot {path}: name a file ending in one of .{', .'.join(sorted(kinds))}"
        )
    if not Path(path).absolute().parent.is_dir():
        raise InvalidArgument(f"--plot {path}: its folder does not exist")
    return plt


def _plot(plt: object, outcomes: Sequence[sim.Outcome], trace: sim.Trace, path: str) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.5))  # type: ignore[attr-defined]
    for policy in dict.fromkeys(o.policy for o in outcomes):
        points = sorted(
            (o.capacity_blocks / trace.num_distinct * 100, o.hit_ratio * 100)
            for o in outcomes
            if o.policy == policy
        )
        style = {"linestyle": "--", "color": "black"} if policy == sim.OPTIMAL else {}
        axes.plot(*zip(*points, strict=True), marker="o", label=policy, **style)
    axes.set_xlabel("capacity (% of the trace's distinct blocks)")
    axes.set_ylabel("block hit ratio (%)")
    axes.set_title(f"{trace.name}: {trace.num_requests:,} requests")
    axes.grid(alpha=0.3)
    axes.legend()
    try:
        figure.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise InvalidArgument(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)  # type: ignore[attr-defined]
