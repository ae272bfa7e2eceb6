"""Hugging Face transformers: reuse cached prompt prefixes in ``*ForCausalLM`` models.

::

    from kvcache.integrations import transformers as kvhf
    pc = kvhf.prefix_cache(kvcache.open("llama-cache"), model, model_id="llama-3-8b-instruct")
    out = kvhf.generate(model, pc, input_ids, max_new_tokens=64)  # as model.generate
    cache, n = kvhf.load(pc, input_ids)                # a DynamicCache of the first n tokens
    kvhf.save(pc, input_ids, outputs.cache)            # after any forward or generate
                                                       # (outputs.past_key_values before 5.24)

Supported: transformers ``>=4.56,<5.26`` with torch, models on any device
(CPU, CUDA, or any other torch device; see ``devices`` for how KV moves),
whose cache layers are all full attention (e.g. Llama, Qwen2, Mistral
without a sliding window; ``check_model`` tells). Two things differ within
that range, and both are read once at import from the release's code
(``_Flavor``), not from its version number:

- the cache keyword of ``forward`` and ``generate`` (and the outputs'
  field): ``cache`` from 5.24, ``past_key_values`` before
  (:data:`CACHE_KEYWORD`). It is read from ``LlamaForCausalLM.forward``'s
  signature, and every model is checked the same way, because a release
  takes an unknown keyword into ``**kwargs`` and silently computes without
  the cached prefix -- trying one and seeing is not a test;
- ``DynamicLayer.lazy_initialization`` takes ``(keys, values)`` in 5.x and
  ``(keys)`` in 4.56-4.57.

Releases before 4.56 build ``DynamicCache`` differently (4.50-4.53:
``key_cache``/``value_cache`` lists; 4.54-4.55: layers without
``lazy_initialization``), and 5.26 onwards is untested: importing this
module on them, or on a release without the features above, raises
``DependencyError``. CI tests both ends (``scripts/test-transformers.sh
4.56.0``; the main venv gets 5.25).

The restored cache never covers the whole prompt: at least its last token is
recomputed, since its logits give the first new token (a cache covering
everything leaves generate with nothing to run). A loaded cache's layers are
views of one array -- the one :meth:`PrefixCache.retrieve` filled on the
CPU, or its single copy on the model's device; the model's first
``DynamicLayer.update`` concatenates them with the new tokens, as it would
any cache. The KV are in the model's dtype, since the cache's layout is the
model's (``layout_of``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DependencyError, InvalidArgument
from ..pool import Pool
from ..prefix import KVLayout, PrefixCache
from ..prefix.arrays import torch_dtype_name
from ..prefix.keys import as_tokens

SUPPORTED = ">=4.56,<5.26"
_MIN, _BELOW = (4, 56), (5, 26)

try:
    import torch
    import transformers
except ImportError as exc:
    raise DependencyError(
        f"kvcache.integrations.transformers needs torch and transformers{SUPPORTED} ({exc}): "
        "pip install 'kvcache[transformers]'"
    ) from exc


def _check_version(version: str) -> None:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or not _MIN <= (int(match[1]), int(match[2])) < _BELOW:
        raise DependencyError(
            f"kvcache.integrations.transformers supports transformers{SUPPORTED}, not {version}: "
            f"older releases build DynamicCache differently, and newer ones are untested. "
            f"pip install 'transformers{SUPPORTED}'"
        )


@dataclass(frozen=True)
class _Flavor:
    """What differs between the supported releases, read from their code, not their version.

    Attributes:
        keyword: the cache keyword of ``forward`` and ``generate``, and the
            field of their outputs: ``cache`` from 5.24, ``past_key_values``
            before. Read from ``LlamaForCausalLM.forward``'s signature because a release
            that does not know the keyword silently ignores it.
        init_takes_values: ``DynamicLayer.lazy_initialization`` takes
            ``(keys, values)`` (5.x) rather than ``(keys)`` (4.56-4.57).
    """

    keyword: str
    init_takes_values: bool


def _detect_flavor() -> _Flavor:
    keyword = _cache_keyword(LlamaForCausalLM.forward)
    init = getattr(DynamicLayer, "lazy_initialization", None)
    # check_model reads the layer kinds off DynamicCache(config=); a constructor that took
    # config into **kwargs (4.54-4.55) would show every layer as full attention.
    takes_config = "config" in inspect.signature(DynamicCache.__init__).parameters
    if keyword is None or init is None or not takes_config or not hasattr(DynamicCache(), "layers"):
        raise DependencyError(
            f"transformers {transformers.__version__} lacks the cache API kvcache uses "
            f"(a forward keyword cache= or past_key_values=, DynamicCache(config=).layers, "
            f"DynamicLayer.lazy_initialization): pip install 'transformers{SUPPORTED}'"
        )
    num_params = len(inspect.signature(init).parameters)  # self, keys[, values]
    return _Flavor(keyword=keyword, init_takes_values=num_params >= 3)


def _cache_keyword(forward: Any) -> str | None:
    parameters = inspect.signature(forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


_check_version(transformers.__version__)

from transformers import DynamicCache, LlamaForCausalLM  # noqa: E402 (after the version check)
from transformers.cache_utils import DynamicLayer  # noqa: E402

from . import devices  # noqa: E402 (imports torch)

_FLAVOR = _detect_flavor()
CACHE_KEYWORD = _FLAVOR.keyword
"""``"cache"`` or ``"past_key_values"``: the keyword this transformers release's
``forward`` and ``generate`` take the cache by, and the field of their outputs
that holds it (``model(ids, **{CACHE_KEYWORD: cache})``)."""


def layout_of(model: Any) -> KVLayout:
    """The KV layout of a transformers model: layers, KV heads, head size and dtype.

    Raises:
        InvalidArgument: the model's dtype is not float32, float16 or bfloat16.
    """
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = torch_dtype_name(model.dtype)
    if dtype is None:
        raise InvalidArgument(
            f"models of dtype {model.dtype} are not supported: use float32/16 or bfloat16"
        )
    return KVLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        dtype=dtype,
    )


def prefix_cache(
    pool: Pool,
    model: Any,
    *,
    model_id: str | None = None,
    chunk_tokens: int = 256,
    salt: str | bytes | None = None,
) -> PrefixCache:
    """A :class:`PrefixCache` for ``model``: its layout and dtype, named ``model_id``.

    Args:
        pool: where the chunks live.
        model: a transformers ``*ForCausalLM`` model.
        model_id: the name its chunks are kept under; default the name it was
            loaded from (``model.config.name_or_path``). Give the revision too if
            the weights under one name change.
        chunk_tokens, salt: as for :class:`PrefixCache`.

    Raises:
        InvalidArgument: no model_id and the model has no name (built from a config),
            or a model whose cache this integration cannot restore.
    """
    check_model(model)
    name = model_id or model.config.name_or_path
    if not name:
        raise InvalidArgument("this model has no name (it was built from a config): pass model_id=")
    return PrefixCache(pool, name, layout_of(model), chunk_tokens=chunk_tokens, salt=salt)


def check_model(model: Any) -> None:
    """Refuse models whose cache layers are not all full-attention, or whose
    ``forward`` does not take the release's cache keyword.

    A sliding-window layer keeps only its last window of tokens, and a linear
    attention layer a state, so neither holds a prefix's KV token by token.

    Raises:
        InvalidArgument: such a model.
    """
    if _cache_keyword(model.forward) != CACHE_KEYWORD:
        raise InvalidArgument(
            f"{type(model).__name__}.forward does not take {CACHE_KEYWORD}=, the cache keyword "
            f"of transformers {transformers.__version__}: kvcache could not pass it a cache"
        )
    probe = DynamicCache(config=model.config)
    kinds = {type(layer).__name__ for layer in probe.layers if type(layer) is not DynamicLayer}
    if kinds:
        raise InvalidArgument(
            f"{type(model).__name__} has cache layers of kind {', '.join(sorted(kinds))}: "
            "kvcache reuses only full-attention KV (DynamicLayer)"
        )


def load(pc: PrefixCache, input_ids: Any, *, device: Any = "cpu") -> tuple[DynamicCache, int]:
    """A ``DynamicCache`` holding the cached KV of the longest prefix of ``input_ids``.

    Args:
        pc: the model's prefix cache.
        input_ids: one prompt, shape (n,) or (1, n).
        device: where the KV go: the model's device (``model.device``). Off
            the CPU they are copied there in one transfer (see ``devices``).

    Returns:
        ``(cache, n)``: cache covers ``input_ids[..., :n]``, and
        ``n <= len(input_ids) - 1`` always, so that the last prompt token is
        computed (its logits give the first new token). Run the model on
        ``input_ids[..., n:]`` with ``**{CACHE_KEYWORD: cache}``; on a miss n is 0 and the
        cache is empty.
    """
    tokens = _host_tokens(input_ids)
    cache = DynamicCache()
    if len(tokens) < 2:
        return cache, 0
    device = torch.device(device)
    if device.type == "cpu":
        kv, hit = pc.retrieve(tokens)  # the layers are views of this array: nothing to move
        stacked = _as_torch(kv[:, :, :, : min(hit, len(tokens) - 1)], pc.layout.dtype)
    else:
        stacked = devices.load_to(pc, tokens, len(tokens) - 1, device)
    num_tokens = stacked.shape[3]
    if not num_tokens:
        return cache, 0
    for layer_kv in stacked:
        keys, values = layer_kv[0].unsqueeze(0), layer_kv[1].unsqueeze(0)
        layer = DynamicLayer()
        # What DynamicLayer.update does to an empty layer, minus its copy: update
        # would torch.cat the loaded KV onto an empty tensor, copying it whole.
        if _FLAVOR.init_takes_values:
            layer.lazy_initialization(keys, values)
        else:  # 4.56-4.57; typed against the release mypy sees
            layer.lazy_initialization(keys)  # type: ignore[call-arg,unused-ignore]
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache, num_tokens


def save(
    pc: PrefixCache,
    input_ids: Any,
    cache: Any,
    *,
    priority: int = 0,
    ttl: float | str | None = None,
) -> int:
    """Store the full chunks of ``input_ids`` that ``cache`` covers and the pool lacks.

    Args:
        pc: the model's prefix cache.
        input_ids: the tokens the cache was computed for, (n,) or (1, n); may
            run past the cache (after ``generate``, the last token has no KV yet).
        cache: a ``DynamicCache`` (``outputs.cache``, ``.past_key_values`` before
            5.24) for a batch of one, or a sequence of one (keys, values) pair per
            layer, on any device (off the CPU, the tokens the pool lacks are
            copied back in one transfer).
        priority, ttl: for the pool entries, as in :meth:`Pool.put`.

    Returns:
        How many tokens' KV were written.

    Raises:
        InvalidArgument: a batch of several sequences, or a cache of another layout.
    """
    tokens = _host_tokens(input_ids)
    layers = getattr(cache, "layers", None)
    pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else cache
    if not pairs or any(keys is None for keys, _ in pairs):
        return 0  # nothing computed yet
    keys = pairs[0][0]
    if keys.ndim == 4 and keys.shape[0] != 1:
        raise InvalidArgument(
            f"the cache holds a batch of {keys.shape[0]} sequences: save one sequence at a time"
        )
    num_tokens = min(len(tokens), keys.shape[-2])
    if keys.device.type != "cpu":
        return devices.save_from(pc, tokens[:num_tokens], pairs, priority=priority, ttl=ttl)
    return pc.store(tokens[:num_tokens], pairs, priority=priority, ttl=ttl)


def generate(model: Any, pc: PrefixCache, input_ids: Any, **kwargs: Any) -> Any:
    """``model.generate(input_ids, **kwargs)``, computing only what the pool does not hold.

    Loads the longest cached prefix of the prompt, generates from it, then
    stores the new full chunks of prompt and output, so a later turn that
    repeats this conversation reuses it all.

    Args:
        model: a transformers ``*ForCausalLM`` model of ``pc``'s layout.
        pc: its prefix cache.
        input_ids: one prompt, a (1, n) tensor.
        kwargs: for ``model.generate`` (``max_new_tokens``, sampling, ...).

    Returns:
        What ``model.generate`` returns.

    Raises:
        InvalidArgument: a batch, a cache passed in kwargs, ``use_cache=False``,
            or a model whose layout differs from the cache's.
    """
    if "cache" in kwargs or "past_key_values" in kwargs or kwargs.get("use_cache") is False:
        raise InvalidArgument("kvhf.generate makes the cache itself: drop cache/use_cache")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise InvalidArgument("input_ids must be a (1, n) tensor: generate one prompt at a time")
    layout = layout_of(model)
    if layout != pc.layout:
        raise InvalidArgument(f"the model's KV layout is {layout}, the prefix cache's {pc.layout}")
    check_model(model)
    cache, _ = load(pc, input_ids, device=model.device)
    kwargs.setdefault("attention_mask", torch.ones_like(input_ids))
    output = model.generate(input_ids, **{CACHE_KEYWORD: cache}, **kwargs)
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    save(pc, sequences[0], cache)
    return output


def _host_tokens(input_ids: Any) -> np.ndarray:
    """Token ids as ``as_tokens`` gives them, also from a tensor on a device (copied back)."""
    on_device = isinstance(input_ids, torch.Tensor) and input_ids.device.type != "cpu"
    return as_tokens(input_ids.cpu() if on_device else input_ids)


def _as_torch(array: Any, dtype: str) -> torch.Tensor:
    """A numpy array as a torch tensor of ``dtype`` sharing its memory (bfloat16 from bits)."""
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


__all__ = [
    "CACHE_KEYWORD",
    "SUPPORTED",
    "check_model",
    "generate",
    "layout_of",
    "load",
    "prefix_cache",
    "save",
]
