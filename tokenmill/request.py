"""Request state and the outputs returned to users (torch-free: the simulator reuses it)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from tokenmill.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # its prompt's KV is being copied from another engine
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"        # EOS, stop token or stop string
    LENGTH = "length"    # max_tokens or max_model_len
    ABORT = "abort"
    ERROR = "error"


@dataclass
class RequestEvents:
    """Timestamps (time.monotonic) from which every latency metric is derived."""
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    # the request's share, by tokens, of the time of every engine step it was in (prompt tokens,
    # then decode and draft tokens): what the cost ledger bills
    prefill_device_seconds: float = 0.0
    decode_device_seconds: float = 0.0

    @property
    def device_seconds(self) -> float:
        return self.prefill_device_seconds + self.decode_device_seconds


@dataclass
class SpecDecodingStats:
    """Speculative decoding of one request: verification steps, drafted and accepted tokens, and
    how often the draft at each position was accepted."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_drafted:
            self.accepted_per_position += [0] * (num_drafted - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @classmethod
    def merged(cls, stats: list[SpecDecodingStats]) -> SpecDecodingStats:
        out = cls()
        for st in stats:
            out.num_drafts += st.num_drafts
            out.num_draft_tokens += st.num_draft_tokens
            out.num_accepted_tokens += st.num_accepted_tokens
            for i, n in enumerate(st.accepted_per_position):
                if i == len(out.accepted_per_position):
                    out.accepted_per_position.append(0)
                out.accepted_per_position[i] += n
        return out

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification step (accepted drafts + the one sampled after them)."""
        return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts if self.num_drafts else 0.0


class Request:
    """One sequence. Everything about its phase follows from three counters:
    tokens known (prompt + output), tokens whose KV is computed, tokens reused from cache."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_id: int | None = None, arrival_time: float | None = None,
                 max_tokens: int = 16) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.params = params
        self.eos_token_id = eos_token_id
        self.max_tokens = max_tokens
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first schedule
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.events = RequestEvents(arrival=arrival_time if arrival_time is not None else time.monotonic())
        self.block_hashes: list[bytes] = []  # hash of each full block, chained (filled lazily)
        self.spec_token_ids: list[int] = []  # draft tokens to verify in the next step
        self.spec_stats = SpecDecodingStats()
        self.kv_transfer_params: dict | None = None  # set at finish by a sending KV connector

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids):]

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_token(self, token_id: int, now: float) -> None:
        self.all_token_ids.append(token_id)
        ev = self.events
        if ev.first_token is None:
            ev.first_token = now
        ev.last_token = now
        ev.token_times.append(now)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
                f"computed={self.num_computed_tokens}, {self.status.value})")


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float | None
    num_preemptions: int = 0
    spec_decoding: SpecDecodingStats | None = None  # with speculative decoding on
    prefill_device_seconds: float = 0.0  # summed over the n samples (see RequestEvents)
    decode_device_seconds: float = 0.0


@dataclass
class RequestOutput:
    # vLLM's order of the positional fields
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then one entry per token
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    # a prefill engine's hand-over: what the decode engine needs to load this request's KV
    kv_transfer_params: dict | None = None
