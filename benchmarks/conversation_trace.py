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

Every number above is an option (``Shape``; ``--help`` lists them), for
held-out variants of other shapes, e.g. retrieval-heavy traffic::

    python benchmarks/conversation_trace.py --seed 3 --max-open-sessions 100 \
        --new-session-share 0.4 --document-share 0.8 --num-documents 1000 > conv3.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Shape:
    """The traffic's parameters (the defaults made the README's seed 1 and 2 traces)."""

    num_system_prompts: int = 30
    num_documents: int = 300
    document_share: float = 0.5  # of sessions that open with a document
    max_open_sessions: int = 300
    new_session_share: float = 0.25  # of requests that open a session
    max_turns: int = 12
    max_turn_blocks: int = 10
    zipf_s: float = 1.1


def zipf(rng: random.Random, n: int, s: float = 1.1) -> Callable[[], int]:
    weights = [1 / (i + 1) ** s for i in range(n)]
    return lambda: rng.choices(range(n), weights)[0]


def requests(num_requests: int, seed: int, shape: Shape = Shape()) -> Iterator[dict[str, object]]:
    """The trace's requests, one JSON-ready dict each."""
    rng = random.Random(seed)
    pick_system = zipf(rng, shape.num_system_prompts, shape.zipf_s)
    pick_document = zipf(rng, shape.num_documents, shape.zipf_s)
    system_blocks = [rng.randint(1, 8) for _ in range(shape.num_system_prompts)]
    document_blocks = [rng.randint(4, 30) for _ in range(shape.num_documents)]
    ids: dict[tuple[object, ...], int] = {}
    sessions: list[dict] = []
    for t in range(num_requests):
        if not sessions or rng.random() < shape.new_session_share:
            s = pick_system()
            parts: list[tuple[object, ...]] = [("sys", s, i) for i in range(system_blocks[s])]
            if rng.random() < shape.document_share:
                d = pick_document()
                parts += [("doc", d, i) for i in range(document_blocks[d])]
            session = {"parts": parts, "turns": rng.randint(1, shape.max_turns), "id": t}
            sessions.append(session)
        else:
            session = sessions[rng.randrange(len(sessions))]
        at = len(session["parts"])
        num_blocks = rng.randint(1, shape.max_turn_blocks)
        turn = [("turn", session["id"], at, j) for j in range(num_blocks)]
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
        if len(sessions) > shape.max_open_sessions:
            sessions.pop(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    for field in fields(Shape):
        option = "--" + field.name.replace("_", "-")
        parser.add_argument(option, type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    shape = Shape(**{field.name: getattr(args, field.name) for field in fields(Shape)})
    for request in requests(args.requests, args.seed, shape):
        sys.stdout.write(json.dumps(request) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
