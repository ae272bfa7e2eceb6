"""Writes ``snapshot-v1.kvsnap``: a format-1 snapshot, made by the kvcache of 515ebf2.

Version 1 summed an entry's bytes only; version 2 also sums its flags and
lengths. The file is kept so that ``test_snapshot.py`` restores a real file
of the old writer, not one rebuilt by the new code. To regenerate it::

    git archive 515ebf2 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/make_snapshot_v1.py

``VALUES`` is what the file holds; the test imports it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VALUES: dict[str | bytes, object] = {
    "text key": b"a value of bytes",
    b"\x00bytes key": bytes(range(256)) * 9,  # several 1 KiB pages
    "array": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    "ключ": b"",
}
PRIORITIES = {"text key": 3, b"\x00bytes key": -2}
HITS = {"array": 3}  # reads before the snapshot: a frequency and a recency to restore


def main() -> None:
    import kvcache

    name = "make-snapshot-v1"
    target = Path(__file__).with_name("snapshot-v1.kvsnap")
    pool = kvcache.create(name, "64K", page_size="1K", policy="lfu")
    try:
        for key, value in VALUES.items():
            pool.put(key, value, priority=PRIORITIES.get(key, 0))  # type: ignore[arg-type]
        for key, hits in HITS.items():
            for _ in range(hits):
                pool.get(key)
        pool.persist(target)
    finally:
        pool.close()
        kvcache.destroy(name)
    print(f"wrote {target} with kvcache from {kvcache.__file__}", file=sys.stderr)


if __name__ == "__main__":
    main()
