"""One function per ``kvcache`` command: call the Python API, report the result.

Commands hold no pool logic of their own; everything they do is a public
``kvcache`` call. Each returns the JSON document for ``--json`` and prints
the human version through ``Output``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kvcache

from .. import owners
from ..errors import (
    IncompatiblePoolError,
    InvalidArgument,
    KVCacheError,
    PoolExistsError,
    PoolNotFoundError,
    SnapshotError,
    UntrustedOwnerError,
)
from ..policies import POLICIES
from ..snapshot import files
from ..units import format_size
from . import Unhealthy
from .output import Output
from .parser import trust_kwargs

if TYPE_CHECKING:
    from ..accesslog import LogSpec


def create(args: argparse.Namespace, out: Output) -> dict[str, object]:
    try:
        return _create(args, out)
    except PoolExistsError:
        if not args.exist_ok:
            raise
    # --exist-ok (boot units: a service restarted while its pool lives on keeps the pool)
    with kvcache.open(args.name, **trust_kwargs(args)) as pool:
        stats = pool.stats()
    out.line(f"pool '{args.name}' exists already: left as it is ({stats.num_entries} entries)")
    return {"created": None, "existing": stats.to_dict()}


def _create(args: argparse.Namespace, out: Output) -> dict[str, object]:
    # With --restore the flags still describe the pool (the same one whether or
    # not a snapshot exists); the snapshot only fills it.
    options: dict[str, Any] = {
        "page_size": args.page_size,
        "policy": args.policy or ("prefix" if args.prefix_cache else "lru"),
        "max_entries": args.max_entries,
        "inline_bytes": args.inline_bytes,
        "default_ttl": args.ttl,
    }
    mode = _octal_mode(args.mode)
    snapshot = _snapshot_to_create_from(args)
    if args.restore and snapshot.exists():
        config = kvcache.PoolConfig.build(args.size, **options)
        try:
            pool, report = kvcache.restore_with_report(
                args.name,
                snapshot,
                config=config,
                prealloc=args.prealloc,
                mode=mode,
                force=args.force,
                tier=args.tier,
                folder=args.path,
                **trust_kwargs(args),
            )
        except PoolExistsError:
            raise PoolExistsError(
                f"pool '{args.name}' already exists: open it, or destroy it first"
            ) from None
        with pool:
            doc: dict[str, object] = {
                "created": pool.stats().to_dict(),
                "restored_from": str(snapshot),
                "restore": report.to_dict(),
            }
            out.line(
                f"created pool '{args.name}' from {snapshot}: "
                f"{report.num_restored} entries restored"
            )
            return doc
    with kvcache.create(
        args.name,
        args.size,
        **options,
        prealloc=args.prealloc,
        mode=mode,
        force=args.force,
        spill_to=args.spill_to,
        promote=args.promote,
        tier=args.tier,
        path=args.path,
        remote=args.remote,
        namespace=args.namespace,
        write_through=args.write_through,
        remote_timeout=args.remote_timeout,
        password_file=args.password_file,
        remote_key_file=args.remote_key_file,
        access_log=args.access_log,
        access_log_size=args.access_log_size,
    ) as pool:
        stats, config, tier, path = pool.stats(), pool.config, pool.tier, pool.path
    remote = f", remote {args.remote} (namespace {args.namespace})" if args.remote else ""
    out.line(
        f"created pool '{args.name}': {format_size(config.size_bytes)}, policy {config.policy}, "
        f"{format_size(config.page_size_bytes)} pages, up to {config.max_entries} entries, "
        + (
            f"{config.inline_bytes}-byte inline slots ({format_size(config.slots_bytes)}), "
            if config.inline_bytes
            else ""
        )
        + f"tier {tier}"
        + (f", spills to '{args.spill_to}'" if args.spill_to else "")
        + remote
    )
    if args.restore:
        out.line(f"no snapshot at {snapshot}: the pool starts empty")
    return {
        "created": stats.to_dict(),
        "config": config.to_dict(),
        "tier": tier,
        "path": str(path),
    }


def _snapshot_to_create_from(args: argparse.Namespace) -> Path:
    """``create``'s snapshot. Only the default one may be missing (the pool then starts
    empty): a snapshot named with ``--snapshot`` is wanted, so its absence is an error."""
    if args.snapshot is None:
        return files.default_path(args.name)
    snapshot = Path(args.snapshot)
    if not args.restore:
        raise InvalidArgument(
            "--snapshot names the snapshot for --restore: add --restore, or leave --snapshot out"
        )
    if not snapshot.exists():
        raise SnapshotError(
            f"no snapshot at {snapshot}: check --snapshot, or leave it out "
            "(without it a missing default snapshot means an empty pool)"
        )
    return snapshot


def _slots_share(config: kvcache.PoolConfig) -> str:
    """How ``status``'s size splits between pages and inline slots, where there are slots."""
    if not config.inline_bytes:
        return ""
    return f" ({format_size(config.size_bytes)} pages, {format_size(config.slots_bytes)} slots)"


def list_pools(args: argparse.Namespace, out: Output) -> dict[str, object]:
    trust = trust_kwargs(args)
    described = [d for d in (_describe_pool(n, trust) for n in kvcache.list_pools()) if d]
    docs = [doc for doc, _ in described]
    rows = [row for _, row in described]
    if rows:
        out.table(
            ("NAME", "SIZE", "USED", "ENTRIES", "HIT-RATE", "POLICY", "TIER"),
            rows,
            right=("SIZE", "USED", "ENTRIES", "HIT-RATE"),
        )
    else:
        out.line("no pools: create one with kvcache create NAME --size 1G")
    for doc in docs:
        if "error" in doc:
            out.line(f"- {doc['error']}")
    return {"pools": docs}


def _describe_pool(
    name: str, trust: dict[str, Any]
) -> tuple[dict[str, object], tuple[object, ...]] | None:
    """``list``'s JSON document and table row for one listed pool; None if it went away.

    A pool that cannot be opened is still listed, with why and whose it is (its
    owner, as a name): another user's pool is not opened unless trusted.
    """
    try:
        with kvcache.open(name, observe=True, **trust) as pool:
            stats, tier = pool.stats(), pool.tier
    except KVCacheError as exc:
        path = _recorded_path(name)
        if path is None or (isinstance(exc, PoolNotFoundError) and not path.exists()):
            if path is not None and path.parent == kvcache.segment.shm_dir():
                return None  # destroyed since it was listed (another user's pool is still shown)
            # A registered pool whose file is gone (or whose record is damaged): destroy forgets it.
            gone: dict[str, object] = {"name": name, "error": str(exc), "path": str(path)}
            return gone, (name, "-", "-", "-", "-", "missing", "disk")
        doc: dict[str, object] = {"name": name, "error": str(exc), "owner": owners.owner_name(path)}
        shown = "untrusted" if isinstance(exc, UntrustedOwnerError) else "unreadable"
        return doc, (name, "-", "-", "-", "-", shown, "-")
    row = (
        name,
        format_size(stats.size_bytes),
        format_size(stats.used_bytes),
        stats.num_entries,
        f"{stats.hit_rate:.1%}",
        stats.policy,
        tier,
    )
    return {**stats.to_dict(), "tier": tier}, row


def _recorded_path(name: str) -> Path | None:
    """Where pool ``name`` should be, or None if even that cannot be told (a damaged record)."""
    try:
        return kvcache.segment.segment_path(name)
    except KVCacheError:
        return None


def status(args: argparse.Namespace, out: Output) -> dict[str, object]:
    if args.name is None:
        if args.watch:
            raise InvalidArgument("--watch needs a pool: kvcache status NAME --watch")
        return list_pools(args, out)
    if args.watch:
        from .operations import watch  # rich's live display

        return watch(args, out)
    with kvcache.open(args.name, observe=True, **trust_kwargs(args)) as pool:
        stats, config, tier, path = pool.stats(), pool.config, pool.tier, pool.path
        below = _chain_below(pool)
        remote = _remote_doc(pool)
        logged = pool.access_log
    num_elsewhere = stats.num_attached - len(stats.attached)  # in other PID namespaces
    snapshot = files.default_path(args.name)
    snapshot_age = time.time() - snapshot.stat().st_mtime if snapshot.exists() else None
    doc = {
        **stats.to_dict(),
        "config": config.to_dict(),
        "tier": tier,
        "path": str(path),
        "snapshot": {"path": str(snapshot), "age_s": snapshot_age}
        if snapshot_age is not None
        else None,
        "spill_to": below[0]["name"] if below else None,
        "chain": below,
        "remote": remote,
        "access_log": _log_doc(logged.spec if logged else None),
    }
    rows = [
        ("pool", args.name),
        ("path", doc["path"]),
        ("tier", doc["tier"]),
        ("policy", stats.policy),
        ("size", format_size(stats.size_bytes) + _slots_share(config)),
        ("used", f"{format_size(stats.used_bytes)} ({stats.used_bytes / stats.size_bytes:.1%})"),
        ("free", format_size(stats.free_bytes)),
        ("page size", format_size(stats.page_size_bytes)),
        *([("inline slots", f"{config.inline_bytes} B each")] if config.inline_bytes else []),
        ("entries", f"{stats.num_entries} of {stats.max_entries}"),
        ("default ttl", f"{config.default_ttl_s:g}s" if config.default_ttl_s else "none"),
        ("hits / misses", f"{stats.hits} / {stats.misses} ({stats.hit_rate:.1%} hit rate)"),
        ("puts", stats.puts),
        ("evictions", stats.evictions),
        ("expirations", stats.expirations),
        ("repairs", stats.repairs),
        ("damaged", stats.damaged),
        ("spills / promotions", f"{stats.spills} / {stats.promotions}"),
        ("spills to", _chain_line(below, remote)),
        ("attached", _attached(stats.attached, num_elsewhere)),
        (
            "access log",
            f"{logged.spec.path} (up to {format_size(logged.spec.max_bytes)})" if logged else "off",
        ),
        (
            "snapshot",
            f"{snapshot} ({_age(snapshot_age)} old)" if snapshot_age is not None else "none",
        ),
    ]
    out.table(("FIELD", "VALUE"), rows)
    if below:
        out.table(
            ("TIER", "NAME", "ENTRIES", "USED", "HITS", "MISSES", "SPILLS", "PROMOTIONS"),
            [_tier_row(i, tier) for i, tier in enumerate([{**doc, "name": args.name}, *below])],
            right=("ENTRIES", "USED", "HITS", "MISSES", "SPILLS", "PROMOTIONS"),
        )
    if remote is not None:
        out.table(("REMOTE", "VALUE"), _remote_rows(remote))
    return doc


def _remote_doc(pool: kvcache.Pool) -> dict[str, Any] | None:
    """``status``'s document of the pool's remote tier, pinged now; None without one."""
    link = pool.remote
    if link is None:
        return None
    ping_s = link.ping()
    stats = pool.remote_stats()
    assert stats is not None
    return {**stats.to_dict(), "up": ping_s is not None, "ping_s": ping_s, "problem": link.problem}


def _remote_rows(doc: dict[str, Any]) -> list[tuple[str, object]]:
    state = f"up (ping {doc['ping_s'] * 1e3:.2f} ms)" if doc["up"] else f"down: {doc['problem']}"
    return [
        ("url", doc["url"]),
        ("namespace", doc["namespace"]),
        ("writes", "every put (write-through)" if doc["write_through"] else "evicted entries"),
        ("state", state),
        ("hits / misses", f"{doc['hits']} / {doc['misses']}"),
        ("bytes in / out", f"{format_size(doc['bytes_in'])} / {format_size(doc['bytes_out'])}"),
        ("writes / dropped", f"{doc['writes']} / {doc['dropped']}"),
        ("errors / damaged", f"{doc['errors']} / {doc['damaged']}"),
        ("mean latency", f"{doc['mean_latency_s'] * 1e3:.2f} ms over {doc['calls']} calls"),
    ]


def _chain_below(pool: kvcache.Pool) -> list[dict[str, Any]]:
    """``status``'s documents of the pools below ``pool``, top first; a cut link says why."""
    tiers = list(pool.chain())
    docs: list[dict[str, Any]] = [
        {**lower.stats().to_dict(), "tier": lower.tier, "path": str(lower.path)}
        for lower in tiers[1:]
    ]
    if tiers[-1].spill_to is not None:  # named, but not open now
        docs.append({"name": tiers[-1].spill_to, "error": tiers[-1].lower_problem})
    return docs


def _chain_line(below: list[dict[str, Any]], remote: dict[str, Any] | None) -> str:
    if not below and remote is not None and not remote["write_through"]:
        return f"the remote {remote['url']} (evicted entries go there)"
    if not below:
        return "none (evictions drop entries)"
    return " -> ".join(
        f"{d['name']} (missing: {d['error']})" if "error" in d else str(d["name"]) for d in below
    )


def _tier_row(depth: int, doc: dict[str, Any]) -> tuple[object, ...]:
    if "error" in doc:
        return (depth, doc["name"], "-", "-", "-", "-", "-", "-")
    return (
        depth,
        doc["name"],
        doc["num_entries"],
        format_size(doc["used_bytes"]),
        doc["hits"],
        doc["misses"],
        doc["spills"],
        doc["promotions"],
    )


def entries(args: argparse.Namespace, out: Output) -> dict[str, object]:
    with kvcache.open(args.name, observe=True, **trust_kwargs(args)) as pool:
        listed = pool.entries(sort=args.sort, limit=args.limit or None)
        total = pool.stats().num_entries  # this pool's own (len() counts the whole chain)
    now = time.time()
    rows = [
        (
            _show_key(e.key),
            format_size(e.size_bytes),
            e.priority,
            "never" if e.expires_at is None else _age(e.expires_at - now),
            f"{_age(now - e.accessed_at)} ago",
            f"{_age(now - e.created_at)} ago",
            f"{e.frequency:.2f}",
        )
        for e in listed
    ]
    out.table(
        ("KEY", "SIZE", "PRIORITY", "EXPIRES-IN", "LAST-ACCESS", "CREATED", "FREQ"),
        rows,
        right=("SIZE", "PRIORITY", "LAST-ACCESS", "CREATED", "FREQ"),
    )
    out.line(f"{len(listed)} of {total} entries, sorted by {args.sort}")
    return {"entries": [e.to_dict() for e in listed], "num_entries": total, "sort": args.sort}


def health(args: argparse.Namespace, out: Output) -> dict[str, object]:
    with kvcache.open(args.name, **trust_kwargs(args)) as pool:
        problems = pool.check(repair=args.repair)
        after = pool.check() if args.repair and problems else problems
    for problem in problems:
        out.line(f"- {problem}")
    if not problems:
        out.line(f"pool '{args.name}' is consistent")
    elif not after:
        out.line(f"pool '{args.name}': repaired {len(problems)} problems; it is consistent now")
    doc = {
        "name": args.name,
        "problems": problems,
        "repaired": bool(args.repair and problems),
        "consistent": not after,
    }
    if after:
        out.line(
            f"pool '{args.name}' has {len(after)} problems: run kvcache health {args.name} --repair"
        )
        out.document(doc)
        raise Unhealthy
    return doc


def persist(args: argparse.Namespace, out: Output) -> dict[str, object]:
    with kvcache.open(args.name, **trust_kwargs(args)) as pool:
        start = time.perf_counter()
        with out.progress(f"persisting {args.name}") as progress:
            path = kvcache.persist(pool, args.path, progress)
        elapsed = time.perf_counter() - start
    info = kvcache.inspect_snapshot(path)
    out.line(
        f"persisted '{args.name}': {info.num_entries} entries, "
        f"{format_size(info.data_bytes)} to {path} in {elapsed:.2f}s"
    )
    return {**info.to_dict(), "elapsed_s": elapsed}


def restore(args: argparse.Namespace, out: Output) -> dict[str, object]:
    path = Path(args.path) if args.path else files.default_path(args.name)
    mode = None if args.mode is None else _octal_mode(args.mode)
    start = time.perf_counter()
    with out.progress(f"restoring {args.name}") as progress:
        try:
            pool, report = kvcache.restore_with_report(
                args.name,
                path,
                replace=args.replace,
                size=args.size,
                mode=mode,
                force=args.force,
                progress=progress,
                tier=args.tier,
                folder=args.folder,
                **trust_kwargs(args),
            )
        except PoolExistsError:
            raise PoolExistsError(
                f"pool '{args.name}' already exists: pass --replace to replace it, "
                "or destroy it first"
            ) from None
    elapsed = time.perf_counter() - start
    with pool:
        stats = pool.stats()
    out.line(
        f"restored '{args.name}' from {path} in {elapsed:.2f}s: {report.num_restored} entries, "
        f"{format_size(stats.used_bytes)} ({report.num_expired} expired, "
        f"{report.num_dropped} did not fit, {len(report.skipped)} damaged)"
    )
    for skipped in report.skipped:
        out.line(f"- skipped {skipped}")
    return {**report.to_dict(), "path": str(path), "elapsed_s": elapsed, "pool": stats.to_dict()}


def evict(args: argparse.Namespace, out: Output) -> dict[str, object]:
    with kvcache.open(args.name, **trust_kwargs(args)) as pool:
        result = pool.evict(percent=args.percent, bytes=args.bytes, expired=args.expired)
    out.line(
        f"removed {result.num_entries + result.num_expired} entries ({result.num_expired} expired) "
        f"from '{args.name}', freeing {format_size(result.num_bytes)}"
    )
    return {"name": args.name, **result.to_dict()}


def destroy(args: argparse.Namespace, out: Output) -> dict[str, object]:
    try:
        with kvcache.open(args.name, **trust_kwargs(args)) as pool:
            stats = pool.stats()
        num_entries, what = stats.num_entries, f"{format_size(stats.used_bytes)} used"
    except PoolNotFoundError:
        if not kvcache.segment.is_taken(args.name):
            raise
        kvcache.destroy(args.name)  # a disk pool whose file is gone: only its record is left
        out.line(f"forgot pool '{args.name}': its file was gone already")
        return {"destroyed": args.name, "num_entries": 0}
    except IncompatiblePoolError:
        # another format (an older kvcache's) or a damaged header: no process of ours
        # can be attached through it, so it is destroyed as it is (as the API does)
        num_entries, what = 0, "unreadable by this kvcache"
    if not args.yes:
        _confirm_destroy(args.name, f"{num_entries} entries, {what}")
    kvcache.destroy(args.name, force=args.force, **trust_kwargs(args))
    out.line(f"destroyed pool '{args.name}'")
    return {"destroyed": args.name, "num_entries": num_entries}


def _confirm_destroy(name: str, what: str) -> None:
    """Ask on a terminal; elsewhere (a script, a pipe) nobody can answer, so refuse."""
    if not sys.stdin.isatty():
        raise KVCacheError(
            "not destroyed: stdin is not a terminal to confirm on: "
            f"pass --yes to destroy pool '{name}'"
        )
    answer = input(f"destroy pool '{name}' ({what})? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise KVCacheError("not destroyed: answer y to confirm, or pass --yes")


def access_log(args: argparse.Namespace, out: Output) -> dict[str, object]:
    if args.off == (args.file is not None):
        raise InvalidArgument("give a FILE to log to, or --off to stop logging")
    if args.off and args.max_size is not None:
        raise InvalidArgument("--max-size goes with a FILE, not with --off")
    with kvcache.open(args.name, **trust_kwargs(args)) as pool:
        spec = pool.set_access_log(None if args.off else args.file, args.max_size)
    if spec is None:
        out.line(f"pool '{args.name}' no longer logs its prefix requests")
        return {"name": args.name, "access_log": None}
    out.line(
        f"pool '{args.name}' logs its prefix requests to {spec.path} "
        f"(up to {format_size(spec.max_bytes)} with {spec.path}.1)"
    )
    return {"name": args.name, "access_log": _log_doc(spec)}


def _log_doc(spec: LogSpec | None) -> dict[str, object] | None:
    return None if spec is None else {"path": str(spec.path), "max_bytes": spec.max_bytes}


def policies(args: argparse.Namespace, out: Output) -> dict[str, object]:
    out.table(("POLICY", "WHEN TO USE IT"), [(p.name, p.summary) for p in POLICIES.values()])
    return {"policies": [{"name": p.name, "summary": p.summary} for p in POLICIES.values()]}


def _octal_mode(text: str) -> int:
    """``--mode`` as a number; whether it is a safe mode is the API's to check."""
    try:
        return int(text, 8)
    except ValueError:
        raise InvalidArgument(
            f"--mode {text!r} is not octal permissions such as 600 or 660"
        ) from None


def _attached(pids: tuple[int, ...], num_elsewhere: int) -> str:
    """Pids of this PID namespace, and a count of the processes of others (their pids
    would name other processes here)."""
    shown = ", ".join(map(str, pids))
    if num_elsewhere:
        more = f"{num_elsewhere} in other PID namespaces"
        shown = f"{shown} (+{more})" if shown else more
    return shown or "none"


def _show_key(key: str | bytes) -> str:
    text = key if isinstance(key, str) else repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
