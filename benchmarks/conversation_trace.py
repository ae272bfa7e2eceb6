"""A synthetic multi-turn conversation trace in the Mooncake JSONL format.

A held-out check for eviction policies, whose traffic differs from the
Mooncake trace's: sessions open on one of 30 system prompts (1-8 blocks,
Zipf popularity), half of them with one of 300 shared documents (4-30
blocks, Zipf), and each turn extends the session's previous prompt by 1-10
blocks (the last answer and a new question), so a prompt's tail is reused by
the next turn only. Up to 300 sessions are open at once and each request
continues a random one (a new one a quarter of the time), so turns of a
session are far apart. Block ids name their whole prefix, as Mooncake's do.

    python benchmarks/conversation_trace.py --requests 4000 --seed 1 > conv1.jsonl
    cortex cache simulate conv1.jsonl --policy lru,s3fifo,prefix
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator

NUM_SYSTEM_PROMPTS = 30
NUM_DOCUMENTS = 300
MAX_OPEN_SESSIONS = 300
NEW_SESSION_SHARE = 0.25


def zipf(rng: random.Random, n: int, s: float = 1.1) -> Callable[[], int]:
    weights = [1 / (i + 1) ** s for i in range(n)]
    return lambda: rng.choices(range(n), weights)[0]


def requests(num_requests: int, seed: int) -> Iterator[dict[str, object]]:
    """The trace's requests, one JSON-ready dict each."""
    rng = random.Random(seed)
    pick_system, pick_document = zipf(rng, NUM_SYSTEM_PROMPTS), zipf(rng, NUM_DOCUMENTS)
    system_blocks = [rng.randint(1, 8) for _ in range(NUM_SYSTEM_PROMPTS)]
    document_blocks = [rng.randint(4, 30) for _ in range(NUM_DOCUMENTS)]
    ids: dict[tuple[object, ...], int] = {}
    sessions: list[dict] = []
    for t in range(num_requests):
        if not sessions or rng.random() < NEW_SESSION_SHARE:
            s = pick_system()
            parts: list[tuple[object, ...]] = [("sys", s, i) for i in range(system_blocks[s])]
            if rng.random() < 0.5:
                d = pick_document()
                parts += [("doc", d, i) for i in range(document_blocks[d])]
            session = {"parts": parts, "turns": rng.randint(1, 12), "id": t}
            sessions.append(session)
        else:
            session = sessions[rng.randrange(len(sessions))]
        at = len(session["parts"])
        turn = [("turn", session["id"], at, j) for j in range(rng.randint(1, 10))]
        session["parts"] = session["parts"] + turn
        prefix: tuple[object, ...] = ()
        hash_ids = []
        for part in session["parts"]:
            prefix = (*prefix, part)
            hash_ids.append(ids.setdefault(prefix, len(ids)))
        yield {
            "timestamp": t * 100,
            "input_length": len(hash_ids) * 512,
            "output_length": 100,
            "hash_ids": hash_ids,
        }
        session["turns"] -= 1
        if session["turns"] <= 0:
            sessions.remove(session)
        if len(sessions) > MAX_OPEN_SESSIONS:
            sessions.pop(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for request in requests(args.requests, args.seed):
        sys.stdout.write(json.dumps(request) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
