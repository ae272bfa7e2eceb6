"""Helpers for the multi-process tests: self-verifying values, workloads, child commands.

Imported by the tests (pytest puts this folder on ``sys.path``) and also run
as a script in real child processes::

    python workers.py COMMAND 'JSON-PARAMS'

A child prints ``ready`` on a line of its own once it has opened the pool (for
commands that parents synchronise on), and its result as one JSON line last.

Every value written here is self-verifying: its first 8 bytes are a BLAKE2b
digest of the key and the rest of the value, and byte 8 says whether it was
stored as bytes or as which kind of numpy array. A torn value (bytes from two
writes), another key's value, or an array read back with the wrong dtype or
shape all fail :func:`verify`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np

import kvcache
from kvcache import codec

DIGEST_BYTES = 8
MIN_VALUE_BYTES = DIGEST_BYTES + 2
INLINE_COPY_MAX_BYTES: int = getattr(kvcache.pool, "INLINE_COPY_MAX_BYTES", 64 << 10)
"""Values larger than this are copied outside the pool lock (seqlock path)."""
WORKERS = Path(__file__).resolve()
NO_LIMIT = 1 << 62
"""``codec.encode``'s ``max_bytes`` for values measured here (none comes near it)."""

# byte 8 of every value: how it is stored
AS_BYTES, AS_U8, AS_U32, AS_I64_2D = 0, 1, 2, 3
_ARRAY_SPECS = {AS_U8: ("|u1", 1, 1), AS_U32: ("<u4", 4, 1), AS_I64_2D: ("<i8", 16, 2)}
"""kind -> (dtype, byte multiple the length must have, ndim)."""


# ------------------------------------------------------------------ values


def _digest(key: str, rest: bytes | memoryview) -> bytes:
    h = blake2b(digest_size=DIGEST_BYTES)
    h.update(key.encode())
    h.update(rest)
    return h.digest()


def make_value(key: str, size: int, rng: np.random.Generator, kind: int = AS_BYTES):
    """A value of about ``size`` bytes for ``key``: bytes, or a numpy array of ``kind``."""
    size = max(size, MIN_VALUE_BYTES)
    if kind != AS_BYTES:
        multiple = _ARRAY_SPECS[kind][1]
        size = max(multiple, -(-size // multiple) * multiple)
        size = max(size, -(-MIN_VALUE_BYTES // multiple) * multiple)
    body = bytearray(rng.bytes(size - DIGEST_BYTES))
    body[0] = kind
    data = _digest(key, body) + bytes(body)
    if kind == AS_BYTES:
        return data
    dtype, _, ndim = _ARRAY_SPECS[kind]
    array = np.frombuffer(data, dtype).copy()
    return array.reshape(-1, 2) if ndim == 2 else array


def random_kind(rng: np.random.Generator) -> int:
    return AS_BYTES if rng.random() < 0.6 else int(rng.integers(1, 4))


def verify_data(key: str, data: bytes | memoryview) -> str | None:
    """Why ``data`` (a value's raw bytes) is not an intact value of ``key``; None if it is."""
    if len(data) < MIN_VALUE_BYTES:
        return f"{key}: {len(data)} bytes is shorter than any value written"
    if data[DIGEST_BYTES] not in (AS_BYTES, *_ARRAY_SPECS):
        return f"{key}: unknown kind byte {data[DIGEST_BYTES]}"
    if _digest(key, data[DIGEST_BYTES:]) != bytes(data[:DIGEST_BYTES]):
        return f"{key}: digest mismatch on {len(data)} bytes (torn, mixed or another key's value)"
    return None


def verify(key: str, value: object) -> str | None:
    """Why ``value`` (as returned by ``get``) is not an intact value of ``key``; None if it is."""
    if isinstance(value, np.ndarray):
        data = value.tobytes()
        problem = verify_data(key, data)
        if problem:
            return problem
        kind = data[DIGEST_BYTES]
        if kind == AS_BYTES:
            return f"{key}: stored as bytes but read back as an array"
        dtype, _, ndim = _ARRAY_SPECS[kind]
        if value.dtype != np.dtype(dtype) or value.ndim != ndim:
            return f"{key}: array read back as {value.dtype}/{value.ndim}d, stored {dtype}/{ndim}d"
        return None
    if isinstance(value, bytes):
        problem = verify_data(key, value)
        if problem is None and value[DIGEST_BYTES] != AS_BYTES:
            return f"{key}: stored as an array but read back as bytes"
        return problem
    return f"{key}: get returned {type(value).__name__}"


def pages_of(key: str, value: object, page_size: int, inline_bytes: int = 0) -> int:
    """Pages a stored (key, value) occupies, computed from the public codec (none where it
    fits the pool's inline slot)."""
    encoded = codec.encode(value, NO_LIMIT)
    total = len(key.encode()) + len(encoded.header) + encoded.payload.nbytes
    return 0 if total <= inline_bytes else max(1, math.ceil(total / page_size))


def audit(pool: kvcache.Pool) -> tuple[int, list[str]]:
    """Read and verify every live entry; return (bytes their pages and inline slots take,
    problems), as ``stats().used_bytes`` counts them.

    Call only while no other process uses the pool (it reads keys, then values).
    """
    page_size, inline_bytes = pool.stats().page_size_bytes, pool.config.inline_bytes
    used, problems = 0, []
    for key in pool:  # Pool.__iter__: a snapshot of the live keys
        value = pool.get(key)
        if value is None:
            problems.append(f"{key}: listed by keys() but get() missed")
            continue
        problem = verify(key, value)
        if problem:
            problems.append(problem)
        pages = pages_of(key, value, page_size, inline_bytes)
        used += pages * page_size if pages else inline_bytes
    return used, problems


def random_size(rng: np.random.Generator, max_size: int) -> int:
    """A few bytes to ``max_size``: a third tiny, a third up to 64 KiB, a third beyond."""
    r = rng.random()
    if r < 0.35:
        return int(rng.integers(MIN_VALUE_BYTES, 2048))
    if r < 0.65 or max_size <= INLINE_COPY_MAX_BYTES + 1:
        return int(rng.integers(2048, min(max_size, INLINE_COPY_MAX_BYTES)))
    return int(rng.integers(INLINE_COPY_MAX_BYTES + 1, max_size))


# --------------------------------------------------------------- workloads


def hammer(
    pool: kvcache.Pool,
    *,
    seed: int,
    seconds: float,
    key_space: int,
    max_size: int,
    key_prefix: str = "k",
    mix: tuple[float, float, float, float] = (0.40, 0.65, 0.80, 0.995),
    reuse_values: bool = False,
    on_failure=None,
) -> dict:
    """Random put/get/get_into/delete/evict on ``pool`` for ``seconds``; every read verified.

    ``mix`` holds the cumulative shares of put, get, get_into and delete; the
    rest are explicit evictions. Returns counts; ``failures`` lists what went
    wrong (torn reads, exceptions). ``reuse_values`` keeps up to three values
    per key and mostly stores one of those again, so that less time goes into
    making values and more into pool calls (and their lock).
    ``on_failure(message)``, if given, is called at the first failure.
    """
    rng = np.random.default_rng(seed)
    counts = dict.fromkeys(
        (
            "ops",
            "puts",
            "large_puts",
            "gets",
            "hits",
            "large_hits",
            "verified",
            "deletes",
            "evicts",
        ),
        0,
    )
    failures: list[str] = []
    buffer = bytearray(max_size + 64)
    cache: dict[str, list] = {}

    def fail(message: str) -> None:
        failures.append(message)
        if on_failure is not None:
            on_failure(message)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        key = f"{key_prefix}{int(rng.integers(key_space))}"
        r = rng.random()
        counts["ops"] += 1
        try:
            if r < mix[0]:
                made = cache.setdefault(key, [])
                if reuse_values and len(made) == 3 and rng.random() < 0.9:
                    value = made[int(rng.integers(3))]
                    size = len(codec.encode(value, NO_LIMIT).payload)
                else:
                    size = random_size(rng, max_size)
                    value = make_value(key, size, rng, random_kind(rng))
                    if reuse_values and len(made) < 3:
                        made.append(value)
                    elif reuse_values:
                        made[int(rng.integers(3))] = value
                pool.put(key, value)
                counts["puts"] += 1
                counts["large_puts"] += size > INLINE_COPY_MAX_BYTES
            elif r < mix[1]:
                counts["gets"] += 1
                value = pool.get(key)
                if value is not None:
                    counts["hits"] += 1
                    problem = verify(key, value)
                    if problem:
                        fail(f"get {problem}")
                    else:
                        counts["verified"] += 1
                        counts["large_hits"] += (
                            len(codec.encode(value, NO_LIMIT).payload) > INLINE_COPY_MAX_BYTES
                        )
            elif r < mix[2]:
                counts["gets"] += 1
                length = pool.get_into(key, buffer)
                if length is not None:
                    counts["hits"] += 1
                    problem = verify_data(key, memoryview(buffer)[:length])
                    if problem:
                        fail(f"get_into {problem}")
                    else:
                        counts["verified"] += 1
                        counts["large_hits"] += length > INLINE_COPY_MAX_BYTES
            elif r < mix[3]:
                pool.delete(key)
                counts["deletes"] += 1
            else:
                pool.evict(percent=float(rng.uniform(1, 20)))
                counts["evicts"] += 1
        except Exception as exc:  # any error is a finding: report it, keep going
            fail(f"{type(exc).__name__}: {exc}")
        if len(failures) > 20:
            break
    counts["failures"] = failures
    return counts


def start_script(
    code: str, *args: object, pure: bool = False, wrapper: tuple[str, ...] = ()
) -> subprocess.Popen:
    """Run the Python ``code`` with ``args`` in a child (behind ``wrapper``, e.g. ``unshare``),
    its standard streams piped, in the pure-Python engine if ``pure``, else the compiled one."""
    env = dict(os.environ)
    env.pop("KVCACHE_PURE_PYTHON", None)
    if pure:
        env["KVCACHE_PURE_PYTHON"] = "1"
    return subprocess.Popen(
        [*wrapper, sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def wait_for_line(proc: subprocess.Popen, expected: str, timeout: float) -> None:
    """Read ``proc``'s stdout (a pipe) until the line ``expected``; fail after ``timeout``."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    while True:
        lines = seen.split(b"\n")
        if expected.encode() in lines[:-1]:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"child {proc.pid} did not print {expected!r} in {timeout}s: {seen!r}"
            )
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise AssertionError(
                    f"child {proc.pid} exited before {expected!r}: {seen!r} {stderr}"
                )
            seen += chunk


class Children:
    """Starts worker processes and guarantees they are gone afterwards (``with`` block).

    Args:
        script: the worker script whose commands ``start`` runs (this one by default).
    """

    def __init__(self, script: Path = WORKERS) -> None:
        self.script = script
        self.procs: list[subprocess.Popen] = []

    def start(
        self, command: str, *, wrapper: tuple[str, ...] = (), **params: object
    ) -> subprocess.Popen:
        """Run ``command`` in a child, under ``wrapper`` (e.g. ``unshare ...``) if given."""
        proc = subprocess.Popen(
            [*wrapper, sys.executable, str(self.script), command, json.dumps(params)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    def result(self, proc: subprocess.Popen, timeout: float = 30) -> dict:
        """Wait for ``proc`` to exit cleanly and return its JSON result."""
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, (
            f"child {proc.pid} exited {proc.returncode}: {err.decode()[-3000:]}"
        )
        return json.loads(out.decode().strip().splitlines()[-1])

    def kill(self, proc: subprocess.Popen, timeout: float = 10) -> None:
        """SIGKILL ``proc`` and reap it."""
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=timeout)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


class Deadlock(Exception):
    """A pool call did not return in time."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail with :class:`Deadlock` if the block runs longer than ``seconds`` (main thread).

    SIGALRM interrupts a blocked ``flock`` or ``Lock.acquire``, so a pool left
    locked forever surfaces as an error instead of hanging the test run.
    """

    def expire(signum: int, frame: object) -> None:
        raise Deadlock(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------- child commands


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def cmd_write_values(p: dict) -> dict:
    """Create the pool, store the deterministic sample values, exit without closing."""
    pool = kvcache.create(p["pool"], p["size"], page_size=p["page_size"])
    for key, value in sample_values().items():
        pool.put(key, value)
    return {"stats": pool.stats().to_dict()}


def cmd_read_values(p: dict) -> dict:
    """Open the pool and compare every sample value with what is stored."""
    pool = kvcache.open(p["pool"])
    report = {}
    for key, expected in sample_values().items():
        got = pool.get(key)
        if isinstance(expected, np.ndarray):
            same = (
                isinstance(got, np.ndarray)
                and got.dtype == expected.dtype
                and got.shape == expected.shape
                and got.tobytes() == expected.tobytes()
            )
        else:
            same = type(got) is bytes and got == expected
        report[key] = same
    pool.close()
    return {"same": report}


def sample_values() -> dict[str, object]:
    """Values of every shape the sharing test stores: small, multi-page, arrays."""
    rng = np.random.default_rng(1234)
    return {
        "tiny": b"x",
        "empty": b"",
        "small": rng.bytes(1000),
        "big": rng.bytes(300_000),  # > 64 KiB: the out-of-lock copy path
        "f32": rng.standard_normal((64, 33)).astype(np.float32),
        "i64-3d": rng.integers(-(2**40), 2**40, (7, 5, 300), dtype=np.int64),  # 84 KB
        "bools": rng.random(77) < 0.5,
        "c128": (rng.standard_normal(10) + 1j * rng.standard_normal(10)),
        "scalar": np.array(3.25),  # 0-d
    }


def cmd_count(p: dict) -> dict:
    """Open the pool, report the stats seen, then make exact numbers of puts, hits and misses."""
    pool = kvcache.open(p["pool"])
    seen = pool.stats().to_dict()
    for i in range(p["puts"]):
        pool.put(f"child-{i}", b"v" * 100)
    for i in range(p["hits"]):
        assert pool.get(f"child-{i % p['puts']}") == b"v" * 100
    for i in range(p["misses"]):
        assert pool.get(f"absent-{i}") is None
    pool.close()
    return {"seen": seen}


def cmd_attach_and_wait(p: dict) -> dict:
    """Open the pool, say ready, then close it when stdin says so (or never, if killed)."""
    pool = kvcache.open(p["pool"])
    _say("ready")
    sys.stdin.readline()
    if p.get("close", True):
        pool.close()
    return {}


def cmd_store_on_request(p: dict) -> dict:
    """Open the pool, say ready, then for each key read from stdin put it and print how
    that went as a JSON line (``{"key", "error", "message"}``), until stdin ends."""
    pool = kvcache.open(p["pool"])
    _say("ready")
    for line in sys.stdin:
        key, outcome = line.strip(), {"error": None, "message": ""}
        try:
            pool.put(key, b"stored by the child")
        except kvcache.KVCacheError as exc:
            outcome = {"error": type(exc).__name__, "message": str(exc)}
        _say(json.dumps({"key": key, **outcome}))
    return {}


def cmd_clear(p: dict) -> dict:
    """Open the pool, clear it, and report what was removed and what this process sees."""
    with kvcache.open(p["pool"]) as pool:
        return {"removed": pool.clear(), "len": len(pool), "keys": list(pool.keys())}


def cmd_touch(p: dict) -> dict:
    """Open the pool with a clock stopped at ``now``; touch ``key`` with ``ttl``; report its ttl."""
    with kvcache.open(p["pool"], clock=lambda: p["now"]) as pool:
        return {"touched": pool.touch(p["key"], ttl=p["ttl"]), "ttl": pool.ttl(p["key"])}


def cmd_hammer(p: dict) -> dict:
    pool = kvcache.open(p["pool"])
    _say("ready")
    counts = hammer(
        pool,
        seed=p["seed"],
        seconds=p["seconds"],
        key_space=p["key_space"],
        max_size=p["max_size"],
        mix=tuple(p.get("mix", (0.40, 0.65, 0.80, 0.995))),
    )
    pool.close()
    return counts


def cmd_churn(p: dict) -> dict:
    """Hammer until killed; a failed verification exits at once with status 3."""

    def die(message: str) -> None:
        sys.stderr.write(f"VERIFICATION FAILURE: {message}\n")
        sys.stderr.flush()
        os._exit(3)

    pool = kvcache.open(p["pool"])
    _say("ready")
    hammer(
        pool,
        seed=p["seed"],
        seconds=3600,
        key_space=p["key_space"],
        max_size=p["max_size"],
        reuse_values=True,
        on_failure=die,
    )
    return {}


def cmd_pause_mid_move(p: dict) -> dict:
    """Open the chain's top pool, then put new keys (spills) or get keys held below
    (promotions) with a pause at ``at``, and wait there to be killed.

    ``at`` is ``copy`` (in the middle of copying the entry from one pool into the
    other) or ``published`` (after pool ``into`` published the copy, before the
    source removes its own). The pause wraps the library's own calls in this
    child only; the move itself runs unchanged.
    """
    from kvcache import chain
    from kvcache.engine import Store, whole

    def pause() -> None:
        _say("paused")
        time.sleep(3600)

    if p["at"] == "copy":

        class Pausing:
            def scatter(self, targets: list, pieces: tuple) -> None:
                chain_transfer.scatter(targets, (bytes(pieces[0])[:1],))  # a torn start
                pause()

        chain_transfer = chain.transfer
        chain.transfer = Pausing()  # type: ignore[assignment]
    else:
        write_entry = whole.write_entry

        def write_then_pause(store: Store, *args: object, **kwargs: object) -> bool:
            written = write_entry(store, *args, **kwargs)  # type: ignore[arg-type]
            if written and store.name == p["into"]:
                pause()
            return written

        whole.write_entry = write_then_pause  # type: ignore[assignment]
    pool = kvcache.open(p["pool"])
    rng = np.random.default_rng(p["seed"])
    for i in range(10_000):
        if p["keys"]:
            pool.get(p["keys"][i % len(p["keys"])])
        else:
            key = f"child-{i}"
            pool.put(key, make_value(key, p["value_bytes"], rng))
    return {}


def cmd_hold_lock(p: dict) -> dict:
    """White-box: take the pool lock, half-mutate (skew a counter), then wait to be killed.

    Reaches into the pool's store (its lock and header) on purpose: it is the only way
    to place a death exactly while the lock is held.
    """
    from kvcache.layout import H

    pool = kvcache.open(p["pool"])
    with pool._engine.lock:
        pool._engine.views.header_q[H.used_pages] += p.get("skew_used_pages", 0)
        _say("locked")
        time.sleep(60)  # the parent SIGKILLs us long before this ends
    return {}


def cmd_reserve_and_hold_lock(p: dict) -> dict:
    """White-box: start a large put, and stop for good right after its pages are reserved.

    The store's reserve, compiled and Python's, is wrapped (in this child only): once
    either has made the WRITING entry, still under the lock, the child says ``locked``
    and waits to be killed, leaving both ``dirty`` set and a WRITING entry of its own.
    """
    pool = kvcache.open(p["pool"])
    engine = pool._engine

    def then_hang(reserve: Any) -> Any:
        def reserve_then_hang(*args: object, **kwargs: object) -> int | None:
            eid = reserve(*args, **kwargs)
            if eid is not None:  # the compiled one declines with None: Python's goes on
                _say("locked")
                time.sleep(60)  # the parent SIGKILLs us long before this ends
            return eid

        return reserve_then_hang

    engine._reserve = then_hang(engine._reserve)
    if engine._reserve_compiled is not None:
        engine._reserve_compiled = then_hang(engine._reserve_compiled)
    key = p["key"]
    pool.put(key, make_value(key, p["size"], np.random.default_rng(p["seed"])))
    return {"error": "was not killed"}


def cmd_die_mid_write(p: dict) -> dict:
    """White-box: put a large value and SIGKILL ourselves in the middle of its copy.

    ``transfer.scatter_summed`` (the large-value path, copied outside the lock) is
    wrapped (in this child only) so that it copies the first half of the bytes and then
    the process kills itself: a WRITING entry is left whose owner is dead.
    """
    pool = kvcache.open(p["pool"])

    def scatter_then_die(targets: list, pieces: tuple, fields: tuple) -> int:
        key, header, payload = pieces
        half = (key, header, payload[: len(payload) // 2])
        kvcache.transfer.scatter(targets, half)  # fills the first half of the entry's pages
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    kvcache.transfer.scatter_summed = scatter_then_die
    key = p["key"]
    pool.put(key, make_value(key, p["size"], np.random.default_rng(p["seed"])))
    return {"error": "survived its own SIGKILL"}


def cmd_pause_mid_write(p: dict) -> dict:
    """White-box: put a large value, stopping half-way through its copy until stdin says go.

    The copy runs outside the lock (entry in state WRITING), which is exactly
    when a process that wrongly judged this writer dead would reclaim its pages.
    """
    pool = kvcache.open(p["pool"])
    original = kvcache.transfer.scatter_summed  # the large-value path, outside the lock

    def scatter_with_a_pause(targets: list, pieces: tuple, fields: tuple) -> int:
        key, header, payload = pieces
        half = len(payload) // 2
        kvcache.transfer.scatter(targets, (key, header, payload[:half]))
        _say("copying")
        sys.stdin.readline()
        return original(targets, pieces, fields)

    kvcache.transfer.scatter_summed = scatter_with_a_pause
    key = p["key"]
    value = make_value(key, p["size"], np.random.default_rng(p["seed"]))
    try:
        pool.put(key, value)
    except kvcache.KVCacheError as exc:  # e.g. the pool was destroyed during the copy
        return {"error": type(exc).__name__, "message": str(exc)}
    kvcache.transfer.scatter_summed = original
    problem = verify(key, pool.get(key))
    pool.close()
    return {"problem": problem}


COMMANDS = {
    name[len("cmd_") :].replace("_", "-"): fn
    for name, fn in globals().items()
    if name.startswith("cmd_")
}


def main(argv: list[str]) -> int:
    command, params = argv[1], json.loads(argv[2]) if len(argv) > 2 else {}
    result = COMMANDS[command](params)
    _say(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
