"""Reading traces: the Mooncake format, and one clear line for each way a file is wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcache.simulate import TraceError, read_trace

SHARED_TRACE_LINES = [
    {"timestamp": 0, "input_length": 1500, "output_length": 6, "hash_ids": [0, 1, 2]},
    {"timestamp": 5, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 7]},
]


def write(path, lines):
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    return path


def test_reads_requests_into_flat_arrays(tmp_path):
    lines = [json.dumps(r) + "\n" for r in SHARED_TRACE_LINES]
    trace = read_trace(write(tmp_path / "t.jsonl", [lines[0], "\n", lines[1]]))
    assert trace.num_requests == 2 and trace.num_reads == 6 and trace.num_distinct == 4
    assert trace.request(1).tolist() == [0, 1, 7]
    assert trace.input_tokens.tolist() == [1500, 1100]
    assert trace.timestamps_ms.tolist() == [0.0, 5.0]
    assert trace.head(1).num_reads == 3


def test_optional_fields_default_to_the_blocks_tokens(tmp_path):
    trace = read_trace(write(tmp_path / "t.jsonl", ['{"hash_ids": [3, 4]}\n']), block_tokens=16)
    assert trace.input_tokens.tolist() == [32] and trace.timestamps_ms.tolist() == [0.0]


def test_the_largest_block_id_fits(tmp_path):
    trace = read_trace(write(tmp_path / "t.jsonl", ['{"hash_ids": [18446744073709551615]}\n']))
    assert trace.blocks.dtype == np.uint64 and int(trace.blocks[0]) == 2**64 - 1


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "holds no requests"),
        ("\n\n", "holds no requests"),
        ("not json\n", "line 1: not JSON"),
        ('{"hash_ids": [1]}\n{"hash_ids": [1]\n', "line 2: not JSON"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        ('{"input_length": 3}\n', "line 1: missing field 'hash_ids'"),
        ('{"hash_ids": [1, -2]}\n', "'hash_ids' must be a list of whole numbers"),
        ('{"hash_ids": [1.5]}\n', "'hash_ids' must be a list of whole numbers"),
        ('{"hash_ids": [true]}\n', "'hash_ids' must be a list of whole numbers"),
        ('{"hash_ids": "12"}\n', "'hash_ids' must be a list of whole numbers"),
        ('{"hash_ids": [18446744073709551616]}\n', "'hash_ids' must be a list"),
        ('{"hash_ids": [1], "input_length": -1}\n', "'input_length' must be a whole number"),
        ('{"hash_ids": [1], "timestamp": "noon"}\n', "'timestamp' must be a number"),
        (b"\xff\xfe\n", "line 1: not JSON"),
    ],
)
def test_a_bad_trace_is_one_line_naming_file_and_line(tmp_path, content, says):
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert says in message and str(path) in message and "\n" not in message


def test_a_missing_trace_says_so(tmp_path):
    with pytest.raises(TraceError, match=r"cannot read trace .*missing\.jsonl"):
        read_trace(tmp_path / "missing.jsonl")
