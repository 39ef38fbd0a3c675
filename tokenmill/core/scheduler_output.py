"""What the scheduler hands the executor each step: plain data only (ids, token ids, counts, block
ids, sampling parameters), never a live Request, so it can cross a process boundary (an engine-core
process, a prefill/decode pair) or be consumed by the simulator's performance model."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenmill.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """A request the executor has not seen, or is seeing again after a preemption (its state was
    dropped): everything needed to rebuild it."""
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # non-empty only when resuming after a preemption
    params: SamplingParams
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int  # KV already valid (prefix-cache hits) before this step


@dataclass(frozen=True)
class CachedRequestData:
    """A request the executor already holds: only what changed since its last step."""
    request_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    new_requests: list[NewRequestData] = field(default_factory=list)
    cached_requests: list[CachedRequestData] = field(default_factory=list)
    # request id -> tokens to compute this step, in batch order (draft tokens included)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # request id -> draft tokens to verify after its last known token (speculative decoding)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # ended since the previous step: the executor forgets them
    finished_request_ids: set[str] = field(default_factory=set)
    # preempted this step: the executor drops their batch state (they come back as new requests)
    preempted_request_ids: list[str] = field(default_factory=list)
    # the KV connector's loads and saves for this step (tokenmill/disagg/connector.py), or None
    kv_connector_metadata: Any = None
    # running + waiting after this step's decision: the load speculation's disable_by_batch_size reads
    num_unfinished_requests: int = 0

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens
