"""PerfModelExecutor: the simulator's Executor. The scheduler, KV manager and request lifecycle of
the real EngineCore run unchanged; this executor stands in for the model: it samples a fixed token
(DryRunExecutor) and advances the ManualClock by the performance model's step time."""
from __future__ import annotations

from dataclasses import dataclass

from tokenmill.core.clock import ManualClock
from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.sim.perf_model import BatchShape, PerfModel, batch_shape


@dataclass(frozen=True)
class StepRecord:
    start: float
    duration: float
    scheduled: tuple[tuple[str, int], ...]  # (request id, tokens), in batch order
    shape: BatchShape


class PerfModelExecutor(DryRunExecutor):
    def __init__(self, perf: PerfModel, clock: ManualClock, token_id: int = 0, record: bool = False) -> None:
        super().__init__(token_id, clock, self._cost)
        self.perf = perf
        self.prompt_len: dict[str, int] = {}
        self.remote_kv: dict[str, int] = {}  # request id -> prompt tokens whose KV arrives by transfer
        self.steps: list[StepRecord] | None = [] if record else None
        self.busy_time = 0.0
        self.num_steps = 0
        self.account = True  # time by operator class and by phase (the planner's binding constraint, $/token)
        self.time_by_class: dict[str, float] = {}
        self.prefill_time = 0.0  # busy time attributed to prompt tokens; the rest to generated ones

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in out.finished_request_ids:
            self.prompt_len.pop(rid, None)
            self.remote_kv.pop(rid, None)
        for new in out.new_requests:
            self.prompt_len[new.request_id] = len(new.prompt_token_ids) + len(new.output_token_ids)
        return super().execute(out)

    def _cost(self, out: SchedulerOutput) -> float:
        computed = {c.request_id: c.num_computed_tokens for c in out.cached_requests}
        computed.update({n.request_id: n.num_computed_tokens for n in out.new_requests})
        shape = batch_shape(out, computed, self.prompt_len, self.remote_kv)
        seconds = self.perf.step_time(shape)
        self.busy_time += seconds
        self.num_steps += 1
        if self.account and shape.num_seqs:
            self._account(shape, seconds)
        if self.steps is not None:
            self.steps.append(StepRecord(self.clock.now, seconds, tuple(out.num_scheduled_tokens.items()), shape))
        return seconds

    def _account(self, shape: BatchShape, seconds: float) -> None:
        parts = self.perf.breakdown(shape)
        for k, v in parts.items():
            self.time_by_class[k] = self.time_by_class.get(k, 0.0) + v
        # compute splits by token share; reading weights and KV and the fixed costs by sequence share
        # (a decoding sequence holds its place in the batch as a prefilling one does)
        token_share = shape.num_prefill_tokens / shape.num_tokens
        decode_seqs = min(shape.num_seqs, shape.num_decode_tokens)
        seq_share = (shape.num_seqs - decode_seqs) / shape.num_seqs
        compute = parts["linear_compute"] + parts["attention_compute"] + parts["communication"]
        self.prefill_time += (compute * token_share + (seconds - compute) * seq_share)
