"""Plain records that cross the core's boundaries: what an executor returns for a step, what the
core returns to its frontend, and the per-step statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenmill.request import FinishReason, Request, RequestEvents, SpecDecodingStats


@dataclass(frozen=True)
class SampledLogprobs:
    """Logprobs of one sampled token under the model's raw distribution."""
    logprob: float
    rank: int  # 1 + the number of tokens more likely than the sampled one
    top: list[tuple[int, float]]  # the top-k alternatives, most likely first


@dataclass(frozen=True)
class PromptLogprobs:
    """Logprobs of prompt tokens start, start+1, ...: entry j is log p(prompt[start + j] |
    prompt[:start + j]) with the token's rank and the top-k alternatives. A chunked prefill returns
    its prompt in several pieces; a recomputed prompt (after a preemption) returns it again."""
    start: int  # prompt position of the first entry (>= 1: the first prompt token has no logprob)
    entries: list[SampledLogprobs]


@dataclass
class ModelRunnerOutput:
    """What an executor returns for one step: the requests that sampled (their known tokens are all
    computed) and their new tokens (one each; several with speculative decoding)."""
    req_ids: list[str]
    sampled_token_ids: list[list[int]]  # with drafts: the accepted drafts, then one sampled token
    logprobs: list[list[SampledLogprobs] | None] | None = None  # per request, per token; None: none asked
    spec_token_ids: list[list[int]] | None = None  # per request: drafts proposed for its next step
    expert_load: dict[int, list[int]] | None = None  # MoE: {layer: tokens routed to each expert} this step
    # requests that asked for prompt_logprobs and computed prompt tokens this step (sampling or not)
    prompt_logprobs: dict[str, PromptLogprobs] | None = None
    kv_connector_output: Any = None  # the KV connector worker half's report (disagg.connector.KVConnectorOutput)


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[SampledLogprobs] | None
    finish_reason: FinishReason | None
    stop_reason: int | str | None
    num_cached_tokens: int
    events: RequestEvents
    spec_stats: SpecDecodingStats | None = None
    prompt_logprobs: PromptLogprobs | None = None
    kv_transfer_params: dict | None = None  # a finished request's KV hand-over (prefill role)


@dataclass
class IterationStats:
    num_prompt_tokens: int
    num_generation_tokens: int
    num_batched_tokens: int
    num_seqs: int
    num_preempted: int
    schedule_time: float
    forward_time: float
    step_time: float
    num_drafts: int = 0  # requests that verified draft tokens this step
    num_draft_tokens: int = 0  # speculative tokens verified this step
    num_accepted_tokens: int = 0  # of which accepted
    accepted_per_position: list[int] = field(default_factory=list)  # accepted drafts at position 0, 1, ...
    expert_load: dict[int, list[int]] | None = None  # MoE: {layer: tokens routed to each expert} this step
    kv_transfer: Any = None  # disagg.connector.KVTransferStats of this step, or None

    @classmethod
    def idle(cls) -> IterationStats:
        return cls(0, 0, 0, 0, 0, 0.0, 0.0, 0.0)


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput]
    finished_requests: list[Request]  # ended in this step (for statistics)
    iteration: IterationStats
