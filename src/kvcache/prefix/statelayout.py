"""What an engine's whole saved state depends on, besides the model: its engine and settings.

Some engines save their state whole rather than per token (llama.cpp's
``llama_state_get_data``: the KV of every position, the output buffers, the
RNG), so the state of a prompt can only be reused by a context built with the
same settings -- context length, KV element types, RoPE scaling, and so on.
A ``StateLayout`` names them; it plays for :class:`~kvcache.prefix.StateCache`
the part :class:`~kvcache.prefix.KVLayout` plays for ``PrefixCache``, and
goes into the namespace digest the same way, so states saved under different
settings never share a key.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument


@dataclass(frozen=True)
class StateLayout:
    """An engine and the settings its saved states depend on.

    Attributes:
        engine: the engine's name (``"llama.cpp"``).
        settings: ``(name, value)`` pairs, sorted by name; values as text
            (see :meth:`of`).
    """

    engine: str
    settings: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.engine, str) or not self.engine:
            raise InvalidArgument(f"engine must be a non-empty string, not {self.engine!r}")
        pairs = self.settings
        if not isinstance(pairs, tuple) or not all(
            isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
            for pair in pairs
        ):
            raise InvalidArgument("settings must be a tuple of (name, value) string pairs")
        if list(pairs) != sorted(dict(pairs).items()):
            raise InvalidArgument("settings must be sorted by name, each name once: use of()")

    @classmethod
    def of(cls, engine: str, **settings: object) -> StateLayout:
        """A layout from keyword settings; each value is written with ``str()``."""
        return cls(engine, tuple(sorted((name, str(value)) for name, value in settings.items())))

    def texts(self) -> tuple[str, ...]:
        """The strings hashed into a namespace, in order (``keys`` length-prefixes each,
        so that no two different layouts encode alike)."""
        return (self.engine, *(s for pair in self.settings for s in pair))
