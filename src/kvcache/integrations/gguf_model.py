"""A tiny random-weight Llama written as GGUF: a model llama.cpp loads, with no download.

Used by the llama-cpp-python tests and benchmark, and handy for trying
:mod:`kvcache.integrations.llama_cpp` on a machine without a model file::

    from kvcache.integrations.gguf_model import ModelShape, write_model
    write_model("/tmp/tiny.gguf", ModelShape(num_layers=2, hidden=64))

The tokenizer is a SentencePiece-style ("llama") vocabulary built here: the
three special tokens, the 256 byte tokens ``<0x00>``..``<0xFF>`` (so any
text tokenizes, byte by byte where no piece fits), single characters and some
common English words with a leading ``▁``. Weights are seeded normal values,
float32, so the same shape and seed always write the same file. Needs the
``gguf`` package (``pip install gguf``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DependencyError, InvalidArgument
from ..units import whole_number

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "it",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "has",
    "had",
    "not",
    "but",
    "one",
    "their",
    "they",
    "first",
    "new",
    "after",
    "who",
    "its",
    "also",
    "two",
    "been",
    "more",
    "other",
    "time",
    "into",
    "all",
    "when",
    "there",
    "some",
    "can",
    "only",
    "would",
    "about",
    "over",
    "year",
    "what",
    "than",
    "system",
    "user",
    "assistant",
    "question",
    "answer",
    "model",
    "cache",
    "prompt",
    "token",
    "prefix",
    "shared",
    "memory",
    "process",
]


@dataclass(frozen=True)
class ModelShape:
    """The size of the random Llama: hidden width, layers, heads, MLP width, context.

    Attributes:
        num_layers: decoder blocks.
        hidden: embedding width.
        num_heads: attention heads (``hidden`` must divide by it).
        num_kv_heads: key/value heads (grouped-query attention below ``num_heads``).
        ffn: MLP width.
        context_tokens: the training context length written into the file.
        seed: of the weights.
    """

    num_layers: int = 2
    hidden: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn: int = 128
    context_tokens: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "ffn", "context_tokens"):
            whole_number(getattr(self, name), name, low=1)
        whole_number(self.hidden // self.num_heads, "head size", low=1)
        if self.hidden % self.num_heads or self.num_heads % self.num_kv_heads:
            raise InvalidArgument("hidden must divide by num_heads, and num_heads by num_kv_heads")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """The tokenizer's pieces, their scores (higher merges first) and token types."""
    import gguf

    types = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    kinds = [types.UNKNOWN, types.CONTROL, types.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    kinds += [types.BYTE] * 256
    pieces = ["▁", *string.ascii_letters, *string.digits, *string.punctuation]
    pieces += [f"▁{word}" for word in _WORDS] + [f"▁{c}" for c in string.ascii_lowercase]
    pieces = list(dict.fromkeys(pieces))
    tokens += pieces
    kinds += [types.NORMAL] * len(pieces)
    # SentencePiece merges the highest-scoring pair first: longer pieces score higher
    scores = [0.0] * 259 + [float(len(piece)) for piece in pieces]
    return tokens, scores, [int(kind) for kind in kinds]


def write_model(path: str | Path, shape: ModelShape | None = None) -> Path:
    """Write a random-weight Llama with :func:`vocabulary` as a GGUF file at ``path``.

    Raises:
        DependencyError: the ``gguf`` package is not installed.
    """
    try:
        import gguf
    except ImportError as exc:
        raise DependencyError(f"writing a GGUF model needs gguf ({exc}): pip install gguf") from exc
    shape = shape or ModelShape()
    path = Path(path)
    tokens, scores, kinds = vocabulary()
    head_dim = shape.hidden // shape.num_heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kvcache-tiny-llama")
    writer.add_context_length(shape.context_tokens)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    for name, array in _weights(shape, len(tokens)):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _weights(shape: ModelShape, vocab: int) -> list[tuple[str, np.ndarray]]:
    """Tensors named as llama.cpp's loader expects, numpy (out, in) order."""
    rng = np.random.default_rng(shape.seed)
    hidden, kv_width = shape.hidden, shape.num_kv_heads * (shape.hidden // shape.num_heads)

    def dense(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols), np.float32) * (gain / np.sqrt(cols))).astype(
            np.float32
        )

    ones = np.ones(hidden, np.float32)
    # a wide output layer spreads the logits, so greedy decoding has no near-ties
    tensors = [("token_embd.weight", dense(vocab, hidden)), ("output_norm.weight", ones)]
    tensors.append(("output.weight", dense(vocab, hidden, gain=8.0)))
    for i in range(shape.num_layers):
        block = f"blk.{i}"
        tensors += [
            (f"{block}.attn_norm.weight", ones),
            (f"{block}.attn_q.weight", dense(hidden, hidden)),
            (f"{block}.attn_k.weight", dense(kv_width, hidden)),
            (f"{block}.attn_v.weight", dense(kv_width, hidden)),
            (f"{block}.attn_output.weight", dense(hidden, hidden)),
            (f"{block}.ffn_norm.weight", ones),
            (f"{block}.ffn_gate.weight", dense(shape.ffn, hidden)),
            (f"{block}.ffn_up.weight", dense(shape.ffn, hidden)),
            (f"{block}.ffn_down.weight", dense(hidden, shape.ffn)),
        ]
    return tensors
