"""Persisting a pool that other processes write to at the same time.

Two real writer processes churn the pool (a key space larger than the pool,
so puts evict and replace all the time) with self-verifying values while this
process persists it several times. Every snapshot must restore with no entry
skipped, and every restored value must verify: the snapshot holds each entry
whole, never bytes from two different writes. The writers must also make
progress while a snapshot is being written: persisting locks per entry, it
does not stop the pool.

Two setups: a 48 MiB pool of a few hundred mixed-size entries (realistic), and
an 8 MiB pool of a few large entries replaced at copy speed, where entries are
often evicted and their pages reused while the snapshot copies them; with the
"did the entry change meanwhile" check removed from persist, the second setup
restores a damaged entry in practically every run (6 out of 6 tried).

This file is also the writer: ``python test_snapshot_concurrency.py writer JSON``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from hashlib import blake2b
from pathlib import Path

import numpy as np
import pytest

import kvcache

DIGEST_BYTES = 8
AS_BYTES, AS_ARRAY = 0, 1
HERE = Path(__file__).resolve()


def make_value(key: str, size: int, rng: np.random.Generator) -> bytes | np.ndarray:
    """``digest(key | rest) | rest``, where rest[0] says bytes or uint8 array."""
    body = bytearray(rng.bytes(max(size, 1)))
    body[0] = AS_ARRAY if rng.random() < 0.3 else AS_BYTES
    data = blake2b(key.encode() + bytes(body), digest_size=DIGEST_BYTES).digest() + bytes(body)
    return np.frombuffer(data, np.uint8).copy() if body[0] == AS_ARRAY else data


def problem(key: str, value: object) -> str | None:
    """Why ``value`` is not one whole value written for ``key``; None if it is."""
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim != 1:
            return f"{key}: array of {value.dtype} {value.shape}"
        data = value.tobytes()
        if data[DIGEST_BYTES] != AS_ARRAY:
            return f"{key}: an array whose bytes say bytes"
    elif isinstance(value, bytes):
        data = value
        if len(data) <= DIGEST_BYTES or data[DIGEST_BYTES] != AS_BYTES:
            return f"{key}: bytes whose bytes say array (or too short)"
    else:
        return f"{key}: {type(value).__name__}"
    digest = blake2b(key.encode() + data[DIGEST_BYTES:], digest_size=DIGEST_BYTES).digest()
    return None if digest == data[:DIGEST_BYTES] else f"{key}: checksum mismatch (torn value)"


def random_size(rng: np.random.Generator) -> int:
    """Small (under a page), medium (copied under the lock) and large (seqlock copy) values."""
    kind = rng.random()
    if kind < 0.3:
        return int(rng.integers(1, 16_000))
    if kind < 0.6:
        return int(rng.integers(16_000, 64_000))
    return int(rng.integers(64_000, 300_000))


def writer(params: dict[str, object]) -> None:
    """Put (and now and then read back and verify) until the stop file appears.

    With ``variants``, each key cycles through that many values of 256 KiB to
    1.5 MiB made up front, so puts run at copy speed (hashing 1 MiB costs more
    than storing it) and replace entries as fast as the pool can take them.
    """
    pool = kvcache.open(str(params["pool"]))
    rng = np.random.default_rng(int(params["seed"]))  # type: ignore[call-overload]
    prefix, stop = f"w{params['id']}-", Path(str(params["stop"]))
    key_space = int(params["key_space"])  # type: ignore[call-overload]
    variants = int(params["variants"])  # type: ignore[call-overload]
    made = {
        f"{prefix}{k}": [
            make_value(f"{prefix}{k}", int(rng.integers(256_000, 1_500_000)), rng)
            for _ in range(variants)
        ]
        for k in range(key_space if variants else 0)
    }
    done: list[float] = []
    bad: list[str] = []
    print("ready", flush=True)
    while not stop.exists():
        key = f"{prefix}{int(rng.integers(key_space))}"
        if variants:
            value = made[key][int(rng.integers(variants))]
        else:
            value = make_value(key, random_size(rng), rng)
        pool.put(key, value)
        done.append(time.monotonic())
        if rng.random() < 0.2:
            other = f"{prefix}{int(rng.integers(key_space))}"
            got = pool.get(other)
            if got is not None and (why := problem(other, got)):
                bad.append(why)
    pool.close()
    print(json.dumps({"done": done, "bad": bad}), flush=True)


POOLS = {
    # many entries: a realistic pool, about 330 entries per snapshot
    "48M-lru": dict(
        size="48M",
        policy="lru",
        key_space=700,
        variants=0,
        snapshots=4,
        min_entries=100,
        check_progress=True,
    ),
    # a few large entries, constantly replaced: entries are often evicted and their
    # pages reused while the snapshot copies them (they must be left out, never torn)
    "8M-fifo-large": dict(
        size="8M",
        policy="fifo",
        key_space=12,
        variants=4,
        snapshots=50,
        min_entries=0,
        check_progress=False,
    ),
}


@pytest.mark.parametrize("setup", list(POOLS))
def test_persist_while_two_processes_write_gives_whole_entries(
    make_pool, tmp_path: Path, setup: str
) -> None:
    config = POOLS[setup]
    pool = make_pool(config["size"], page_size="16K", policy=config["policy"])
    stop = tmp_path / "stop"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE),
                "writer",
                json.dumps(
                    {
                        "pool": pool.name,
                        "id": i,
                        "seed": 100 + i,
                        "stop": str(stop),
                        "key_space": config["key_space"],
                        "variants": config["variants"],
                    }
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    restored_names: list[str] = []
    snapshots: list[Path] = []
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read()  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while pool.stats().evictions < 200:  # the pool is full and churning
            assert time.monotonic() < deadline, "the writers never filled the pool"
            assert all(c.poll() is None for c in children), "a writer died"
            time.sleep(0.05)

        windows: list[tuple[float, float]] = []
        puts_during_write: list[int] = []
        evictions_before = pool.stats().evictions
        for i in range(config["snapshots"]):
            seen: list[int] = []

            def count_puts(done: int, total: int, seen: list[int] = seen) -> None:
                seen.append(pool.stats().puts)  # the writers' puts so far

            started = time.monotonic()
            path = kvcache.persist(pool, tmp_path / f"s{i}.kvsnap", progress=count_puts)
            windows.append((started, time.monotonic()))
            snapshots.append(path)
            assert len(seen) >= config["min_entries"]
            puts_during_write.append(seen[-1] - seen[0] if seen else 0)
            time.sleep(0.02)
        assert pool.stats().evictions > evictions_before + 50  # churn went on meanwhile
    finally:
        stop.touch()
        outputs = []
        for child in children:
            try:
                out, err = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
            outputs.append((child.returncode, out, err))

    try:
        results = []
        for returncode, out, err in outputs:
            assert returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
        for result in results:
            assert result["bad"] == []  # the writers' own reads were whole too
        # the writers kept putting while each snapshot was being written
        # (every time where snapshots take long enough to count on it)
        assert sum(puts_during_write) > 0
        if config["check_progress"]:
            assert all(n > 0 for n in puts_during_write), puts_during_write
        for result in results:
            inside = [
                sum(1 for t in result["done"] if a + 0.1 * (b - a) < t < b - 0.1 * (b - a))
                for a, b in windows
            ]
            assert sum(inside) > 0, (inside, windows)
            if config["check_progress"]:
                assert all(n > 0 for n in inside), (inside, windows)

        keys_seen: set[str] = set()
        total_entries = 0
        for path in snapshots:
            info = kvcache.inspect_snapshot(path)
            assert info.num_entries >= config["min_entries"]
            total_entries += info.num_entries
            name = f"test-snapc-{uuid.uuid4().hex[:10]}"
            restored_names.append(name)
            restored, report = kvcache.restore_with_report(name, path)
            with restored:
                assert report.skipped == []  # every entry's checksum verified
                assert (report.num_expired, report.num_dropped) == (0, 0)
                assert report.num_restored == info.num_entries == len(restored)
                problems = []
                for key in restored:
                    assert isinstance(key, str)
                    keys_seen.add(key[:2])
                    if why := problem(key, restored.get(key)):
                        problems.append(why)
                assert problems == []
                assert restored.check() == []
            kvcache.destroy(name)  # 50 restored pools need not all live at once
        assert keys_seen == {"w0", "w1"}
        assert total_entries >= len(snapshots) // 2  # something was there to verify
        assert pool.check() == []
    finally:
        for name in restored_names:
            if name in kvcache.list_pools():
                kvcache.destroy(name)
        for path in snapshots:
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"]:
        writer(json.loads(sys.argv[2]))
    else:
        sys.exit(f"usage: {sys.argv[0]} writer JSON")
