"""Synthetic multi-turn conversation traces in the Mooncake JSONL format.

Two families of shapes, for judging eviction policies on traffic they were
not tuned on:

``chat`` (``ChatShape``) looks like real prompt traffic: its defaults match the
statistics of the Mooncake FAST'25 conversation trace over a trace
of its length (12,000 requests). Every request opens on one root block (the
shared system prompt); three in four sessions then add one of 20 short system
prompts, half quote one of 1,000 shared documents (Zipf), and a first turn's
own text is long and log-normal (median 22 blocks; prompts stop at 246). Most
sessions end after their first turn; one that goes on (36% after the first
turn, 22% after later ones) comes back after a log-normal gap (median 1,500
requests) with its previous prompt less its last block, which was partial and
changed once extended, plus new blocks (median 12). So about 27% of a first
turn's new blocks are read again, 13-17% of later turns', and three in four
blocks are read by one request only; as in the real trace, the exact S3-FIFO
and ARC beat LRU at 1-2% of the distinct blocks and lose to it at 10-20%.

``conversation`` (``Shape``) is the older, friendlier traffic: sessions open
on one of 30 system prompts (1-8 blocks, Zipf popularity), half of them with
one of 300 shared documents (4-30 blocks, Zipf), and each turn extends the
session's previous prompt by 1-10 blocks, so 70-91% of a request's new
blocks are read again. We keep it (and its variants) as further checks.

In ``conversation`` traces up to a few hundred sessions are open at once and
each request continues a random one. In both, block ids name their whole
prefix, as Mooncake's do.

    python benchmarks/conversation_trace.py --shape chat --requests 12000 --seed 1 > chat1.jsonl
    python benchmarks/conversation_trace.py --requests 4000 --seed 1 > conv1.jsonl
    cortex cache simulate chat1.jsonl --policy lru,s3fifo,prefix
    python benchmarks/conversation_trace.py --statistics chat1.jsonl

Every number above is an option (``--help`` lists them), for held-out
variants of other shapes, e.g. retrieval-heavy traffic::

    python benchmarks/conversation_trace.py --seed 3 --max-open-sessions 100 \
        --new-session-share 0.4 --document-share 0.8 --num-documents 1000 > conv3.jsonl
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Shape:
    """The ``conversation`` traffic's parameters (the defaults made the README's seed 1 and 2
    traces)."""

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


def block_ids(parts: list[tuple[object, ...]], ids: dict[tuple[object, ...], int]) -> list[int]:
    """A prompt's block ids: each names its whole prefix (``ids`` numbers the prefixes seen)."""
    hash_ids = []
    prefix: tuple[object, ...] = ()
    for part in parts:
        prefix = (*prefix, part)
        hash_ids.append(ids.setdefault(prefix, len(ids)))
    return hash_ids


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
        hash_ids = block_ids(session["parts"], ids)
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


@dataclass(frozen=True)
class ChatShape:
    """The ``chat`` traffic's parameters; the defaults match the Mooncake conversation trace."""

    num_system_prompts: int = 20  # after the root block every request shares
    system_share: float = 0.75  # of sessions that add a system prompt (1-4 blocks, Zipf)
    num_documents: int = 1000  # shared texts a first turn may quote after its system prompt
    document_share: float = 0.5  # of sessions that quote one (Zipf)
    document_median_blocks: float = 6.0  # (log-normal)
    turn_gap_median: float = 1500.0  # requests between a session's turns (log-normal)
    turn_gap_sigma: float = 1.2
    first_continue_share: float = 0.36  # of first turns that the session follows with a second
    continue_share: float = 0.22  # of later turns that the session follows with another
    first_turn_median_blocks: float = 22.0  # a first turn's own text (log-normal)
    turn_median_blocks: float = 12.0  # a later turn's new blocks (log-normal, at least 1)
    length_sigma: float = 1.0  # of both log-normals
    max_blocks: int = 246  # the longest prompt; a session that would grow past it ends
    zipf_s: float = 1.1


def _lognormal_blocks(rng: random.Random, median: float, sigma: float) -> int:
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def chat_requests(
    num_requests: int, seed: int, shape: ChatShape = ChatShape()
) -> Iterator[dict[str, object]]:
    """The ``chat`` trace's requests, one JSON-ready dict each.

    A prompt's last block is partial: the next turn of its session replaces it
    by a new (full) block with the same position, which is why later turns'
    new blocks come back less often than first turns', as in the Mooncake trace.
    """
    rng = random.Random(seed)
    pick_system = zipf(rng, shape.num_system_prompts, shape.zipf_s)
    system_blocks = [rng.randint(1, 4) for _ in range(shape.num_system_prompts)]
    pick_document = zipf(rng, shape.num_documents, shape.zipf_s)
    document_blocks = [  # at most a quarter of the longest prompt
        min(shape.max_blocks // 4, _lognormal_blocks(rng, shape.document_median_blocks, 1.0))
        for _ in range(shape.num_documents)
    ]
    ids: dict[tuple[object, ...], int] = {}
    due: list[tuple[int, int, dict]] = []  # (request, session id, session): next turns
    for t in range(num_requests):
        if not due or due[0][0] > t:
            parts: list[tuple[object, ...]] = [("root",)]
            if rng.random() < shape.system_share:
                s = pick_system()
                parts += [("sys", s, i) for i in range(system_blocks[s])]
            if rng.random() < shape.document_share:
                d = pick_document()
                parts += [("doc", d, i) for i in range(document_blocks[d])]
            median = shape.first_turn_median_blocks
            session = {"parts": parts, "id": t, "turn": 0}
        else:
            session = heapq.heappop(due)[2]
            session["parts"] = session["parts"][:-1]  # the partial tail, extended
            median = shape.turn_median_blocks
        session["turn"] += 1
        at = len(session["parts"])
        room = shape.max_blocks - at
        num_blocks = min(room, _lognormal_blocks(rng, median, shape.length_sigma))
        turn = [("turn", session["id"], session["turn"], j) for j in range(num_blocks)]
        session["parts"] = session["parts"] + turn
        hash_ids = block_ids(session["parts"], ids)
        yield {
            "timestamp": t * 100,
            "input_length": len(hash_ids) * 512 - rng.randint(1, 511),  # the last block is partial
            "output_length": 100,
            "hash_ids": hash_ids,
            "turn": session["turn"],  # for statistics(); trace readers skip it
        }
        goes_on = shape.first_continue_share if session["turn"] == 1 else shape.continue_share
        if rng.random() < goes_on and len(hash_ids) < shape.max_blocks:
            gap = rng.lognormvariate(math.log(shape.turn_gap_median), shape.turn_gap_sigma)
            heapq.heappush(due, (t + 1 + round(gap), session["id"], session))


SHAPES = {"chat": ChatShape, "conversation": Shape}
"""The trace families by ``--shape`` name."""


@dataclass(frozen=True)
class Statistics:
    """What we measured on the Mooncake conversation trace, measured on any trace.

    A request's turn is its ``turn`` field where the trace has one (``chat``
    traces do). Otherwise it is inferred from the block ids alone: a request
    continues the conversation of the earlier request whose prompt (or all of
    it but its last, partial block) is the longest run of this one's blocks
    seen before; otherwise it is a first turn. The inference takes a short
    first turn that shares a system prompt for a continuation, so inferred
    later-turn figures are rough. A request's new blocks are those no earlier
    request read.
    """

    num_requests: int
    num_distinct: int
    read_once_share: float  # of distinct blocks, read by one request only
    first_turn_reuse: float  # of first turns' new blocks, read again by a later request
    later_turn_reuse: float  # the same for turns 2-4
    root_share: float  # of requests that read the most read first block
    max_depth: int  # blocks in the longest prompt


def statistics(requests: Iterable[dict]) -> Statistics:
    """The ``Statistics`` of a trace given as its requests (``hash_ids``, maybe ``turn``)."""
    readers: dict[int, int] = {}  # block -> requests that read it
    turn_of_end: dict[int, int] = {}  # a prompt's last (or last full) block -> its turn
    new_by_turn: list[tuple[int, list[int]]] = []
    roots: dict[int, int] = {}
    num_requests = max_depth = 0
    for request in requests:
        ids = request["hash_ids"]
        num_requests += 1
        max_depth = max(max_depth, len(ids))
        if ids:
            roots[ids[0]] = roots.get(ids[0], 0) + 1
        seen = 0
        while seen < len(ids) and ids[seen] in readers:
            seen += 1
        turn = request.get("turn") or (turn_of_end.get(ids[seen - 1], 0) + 1 if seen else 1)
        new_by_turn.append((turn, ids[seen:]))
        for block in set(ids):
            readers[block] = readers.get(block, 0) + 1
        for end in ids[-2:]:
            turn_of_end[end] = turn

    def reuse(turns: range) -> float:
        blocks = [b for turn, new in new_by_turn if turn in turns for b in new]
        return sum(readers[b] > 1 for b in blocks) / len(blocks) if blocks else 0.0

    return Statistics(
        num_requests,
        len(readers),
        sum(n == 1 for n in readers.values()) / len(readers) if readers else 0.0,
        reuse(range(1, 2)),
        reuse(range(2, 5)),
        max(roots.values(), default=0) / num_requests if num_requests else 0.0,
        max_depth,
    )


def _read_requests(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="conversation")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--statistics", metavar="TRACE", help="print a trace's Statistics")
    options: dict[str, type] = {}
    for shape in SHAPES.values():
        for field in fields(shape):
            options[field.name] = type(field.default)
    for name, kind in options.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    args = parser.parse_args(argv)
    if args.statistics:
        sys.stdout.write(json.dumps(statistics(_read_requests(args.statistics)).__dict__) + "\n")
        return 0
    cls = SHAPES[args.shape]
    own = {field.name for field in fields(cls)}
    foreign = [n for n in options if n not in own and getattr(args, n) is not None]
    if foreign:
        parser.error(f"--shape {args.shape} has no option --{foreign[0].replace('_', '-')}")
    shape = cls(**{n: getattr(args, n) for n in own if getattr(args, n) is not None})
    generate = chat_requests if isinstance(shape, ChatShape) else requests
    for request in generate(args.requests, args.seed, shape):  # type: ignore[arg-type]
        sys.stdout.write(json.dumps(request) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
