"""What the scheduler tells the workers each step: which blocks to load and which to store.

The scheduler side decides, the worker side copies. Both sides read token
positions the same way::

    token_ids[:end]        the prompt up to the range's end (keys are chained from token 0)
    [start, end)           the tokens moved this step, whole blocks
    block_ids              vLLM's blocks holding tokens start..end-1, in order

A load fills blocks from the pool before the forward; a store copies
blocks that the forward has just filled into the pool, starting at
``start`` (the chunks before it are in the pool already).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class Transfer:
    """One request's range of tokens between the pool and vLLM's blocks.

    Attributes:
        request_id: vLLM's request id (for the log).
        salt: the request's tenant and adapter separator (``names.request_salt``).
        token_ids: the prompt's first ``end`` tokens.
        start: the first token moved: a multiple of the block size.
        block_ids: vLLM's blocks for tokens ``start .. end-1``.
    """

    request_id: str
    salt: str | None
    token_ids: list[int]
    start: int
    block_ids: list[int]

    @property
    def end(self) -> int:
        """One past the last token moved."""
        return len(self.token_ids)


@dataclass
class StepPlan(KVConnectorMetadata):
    """The connector's metadata for one engine step (scheduler -> workers)."""

    loads: list[Transfer] = field(default_factory=list)
    stores: list[Transfer] = field(default_factory=list)
