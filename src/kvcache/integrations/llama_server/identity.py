"""What a llama-server's slot states are valid for: the model's content and the server's settings.

A slot state restores without complaint into any server whose model has the
same tensor shapes, and its KV is then reused -- even when the weights differ
(a fine-tune, another quantisation of the same shape, a random model), and
the output is silently wrong. Keys therefore name:

- the model file's content: BLAKE2b-256 of the whole GGUF, computed once per
  file and remembered under ``$KVCACHE_HOME/model-digests/`` by path, size,
  mtime and inode (hashing a 5 GB file takes seconds; reading its size does not);
- the server's settings that change what a state holds or means: every
  command-line option except those known not to (network, threads, logging,
  sampling defaults, batch sizes), with aliases folded (``-c`` and
  ``--ctx-size`` are one setting) and the model path left out (the digest
  stands for it, so two copies of one file share states);
- what the server itself reports in ``/props``: the context per slot, the
  number of slots and ``build_info`` (a new build may lay KV out differently,
  so states never cross builds).

Context size, KV types, flash attention (the V layout) and stream count
mismatches are also refused by the server with an HTTP 400; RoPE and YaRN
settings and the weights themselves are not, which is why they are keys.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...home import kvcache_home
from ...prefix import StateLayout
from ...safepath import write_whole

ENGINE = "llama-server"
_ALIASES = {
    "-c": "--ctx-size", "-np": "--parallel", "-ctk": "--cache-type-k",
    "-ctv": "--cache-type-v", "-fa": "--flash-attn", "-kvu": "--kv-unified",
    "-no-kvu": "--no-kv-unified", "-m": "--model", "-ngl": "--n-gpu-layers",
    "--gpu-layers": "--n-gpu-layers", "-sm": "--split-mode", "-ts": "--tensor-split",
    "-nkvo": "--no-kv-offload", "-dt": "--defrag-thold", "-ctkd": "--cache-type-k-draft",
    "-ctvd": "--cache-type-v-draft", "-md": "--model-draft", "-cram": "--cache-ram",
    "-t": "--threads", "-tb": "--threads-batch", "-b": "--batch-size", "-ub": "--ubatch-size",
    "-a": "--alias", "-to": "--timeout", "-n": "--n-predict", "-s": "--seed", "-v": "--verbose",
    "-lv": "--verbosity", "-sps": "--slot-prompt-similarity",
}  # fmt: skip
"""Short spellings of llama-server options, folded into the long ones."""
_NOT_KV = frozenset({
    "--model", "--host", "--port", "--threads", "--threads-batch", "--threads-http",
    "--api-key", "--api-key-file", "--timeout", "--metrics", "--slots", "--no-slots",
    "--slot-save-path", "--cache-ram", "--cache-idle-slots", "--no-cache-idle-slots",
    "--verbose", "--verbosity", "--log-file", "--log-colors", "--log-prefix",
    "--log-timestamps", "--log-disable", "--no-webui", "--webui", "--alias", "--props",
    "--batch-size", "--ubatch-size", "--n-predict", "--seed", "--temp", "--top-k", "--top-p",
    "--min-p", "--repeat-penalty", "--slot-prompt-similarity", "--cont-batching",
    "--no-cont-batching", "--mlock", "--no-mmap", "--mmap", "--numa", "--path", "--api-prefix",
    "--sleep-idle-seconds", "--prio", "--prio-batch", "--poll", "--poll-batch", "--cpu-mask",
    "--cpu-range", "--cpu-strict", "--ssl-key-file", "--ssl-cert-file", "--jinja", "--no-jinja",
})  # fmt: skip
"""Options that do not change what a slot's KV holds: left out of the keys, so that
two servers differing only in them (a port, a thread count) share states. ``--jinja``
changes the chat template's text, and with it the tokens, which the keys name anyway."""
_BLOCK_BYTES = 8 << 20


def server_settings(args: Sequence[str]) -> dict[str, str]:
    """The KV-relevant settings in llama-server's command line, by canonical option name.

    An option's value is the next argument unless that starts with ``-`` and is
    not a number (llama-server takes no positional arguments); an option given
    twice (``--lora a --lora b``) keeps both values, in order.
    """
    settings: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        name = args[index]
        value = ""
        if "=" in name and name.startswith("--"):
            name, _, value = name.partition("=")
        elif index + 1 < len(args) and _is_value(args[index + 1]):
            index += 1
            value = args[index]
        index += 1
        name = _ALIASES.get(name, name)
        if name not in _NOT_KV:
            settings.setdefault(name, []).append(value)
    return {name: " ".join(values) for name, values in settings.items()}


def _is_value(arg: str) -> bool:
    if not arg.startswith("-"):
        return True
    try:
        float(arg)
    except ValueError:
        return False
    return True


def layout(props: Mapping[str, object], settings: Mapping[str, str] | None) -> StateLayout:
    """The layout a server's states are filed under.

    Args:
        props: the server's ``GET /props`` document.
        settings: :func:`server_settings` of its command line; None when the
            proxy fronts a server whose command line it was not told.
    """
    generation = props.get("default_generation_settings")
    n_ctx = generation.get("n_ctx") if isinstance(generation, Mapping) else None
    facts = {
        "n_ctx_slot": n_ctx,
        "total_slots": props.get("total_slots"),
        "build_info": props.get("build_info"),
    }
    if settings is None:
        return StateLayout.of(ENGINE, server_args="unspecified", **facts)
    return StateLayout.of(ENGINE, **facts, **{f"arg{name}": v for name, v in settings.items()})


def model_digest(path: str | os.PathLike[str], cache_folder: Path | None = None) -> str:
    """The id of a GGUF file's content: ``gguf-blake2b:<size>:<BLAKE2b-256 hex>``.

    Remembered in ``cache_folder`` (default ``$KVCACHE_HOME/model-digests``) by
    the file's path, size, mtime and inode, so a restart does not read the
    model again; a folder that cannot be written only costs the next hash.

    Raises:
        OSError: the file cannot be read.
    """
    real = os.path.realpath(path)
    stat = os.stat(real)
    stamp = f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}"
    folder = cache_folder or kvcache_home() / "model-digests"
    memo = folder / hashlib.blake2b(real.encode(), digest_size=16).hexdigest()
    try:
        remembered, _, digest = memo.read_text().rpartition("\n")
        if remembered == stamp and len(digest) == 64:
            return f"gguf-blake2b:{stat.st_size}:{digest}"
    except (OSError, UnicodeDecodeError):
        pass
    hasher = hashlib.blake2b(digest_size=32)
    with open(real, "rb") as file:
        while block := file.read(_BLOCK_BYTES):
            hasher.update(block)
    digest = hasher.hexdigest()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_whole(memo, f"{stamp}\n{digest}".encode())
    except OSError:
        pass
    return f"gguf-blake2b:{stat.st_size}:{digest}"
