"""EngineCore: the step loop and the request lifecycle, torch-free.

    step():  schedule ─► executor.execute(SchedulerOutput) ─► advance counters, cache written blocks
             ─► append sampled tokens ─► token stop checks ─► finish & free ─► EngineCoreOutputs

The executor is anything with `execute(scheduler_output) -> ModelRunnerOutput`: the torch model
runner, a performance model (the simulator), or a proxy to another process. Time comes from an
injected clock (time.monotonic by default, a ManualClock in tests and the simulator), and every
request event is stamped with it. Text is not the core's business: stop strings are checked by the
frontend after detokenizing, which then calls `finish_requests`.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tokenmill.core.errors import RequestStepError
from tokenmill.core.kv_cache_manager import KVCacheManager, PrefixCacheStats
from tokenmill.core.outputs import EngineCoreOutput, EngineCoreOutputs, IterationStats, ModelRunnerOutput
from tokenmill.core.scheduler import Scheduler, SchedulerConfig, SchedulerStats
from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.request import FinishReason, Request, SpecDecodingStats

if TYPE_CHECKING:
    from tokenmill.disagg.connector import KVConnectorScheduler

logger = logging.getLogger(__name__)


class Executor(Protocol):
    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


class EngineCore:
    def __init__(self, scheduler_config: SchedulerConfig, kv: KVCacheManager, executor: Executor,
                 clock: Callable[[], float] = time.monotonic,
                 kv_connector: KVConnectorScheduler | None = None) -> None:
        self.kv = kv
        self.executor = executor
        self.clock = clock
        self.scheduler = Scheduler(scheduler_config, kv, clock, kv_connector)

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def finish_requests(self, request_ids: list[str], reason: FinishReason = FinishReason.ABORT,
                        stop_reason: int | str | None = None) -> list[Request]:
        """End requests from outside a step (abort, a stop string found by the frontend); their
        blocks are freed now. Returns the requests that were still running or waiting."""
        ended = []
        for rid in request_ids:
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            req.stop_reason = stop_reason
            self.scheduler.finish_request(req, reason)
            ended.append(req)
        return ended

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def has_pending_kv_transfers(self) -> bool:
        return self.scheduler.has_pending_kv_transfers()

    @property
    def num_waiting_requests(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.waiting_for_remote_kv)

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        t0 = self.clock()
        sched = self.scheduler.schedule()
        if sched.is_empty and sched.kv_connector_metadata is None and not self.scheduler.sending:
            self.scheduler.defer(sched)
            return EngineCoreOutputs([], [], IterationStats.idle())
        prompt_tokens = self._prompt_tokens_per_request(sched)
        charged = [self.scheduler.requests[rid] for rid in sched.num_scheduled_tokens]
        t1 = self.clock()
        try:
            result = self.executor.execute(sched)
        except RequestStepError as e:
            return self._fail_requests(e)
        t2 = self.clock()
        spec = SpecDecodingStats()
        num_rejected = self._verify_drafts(sched, result, spec)
        self.scheduler.update_after_step(sched, num_rejected)
        loaded = []
        if result.kv_connector_output is not None:
            loaded = self.scheduler.update_from_kv_connector(result.kv_connector_output)
        outputs, finished = self._append_sampled(result, t2)
        if loaded:
            self._adopt_first_tokens(loaded, t2, outputs, finished)
        step_time = self.clock() - t0
        self._charge_step(sched, charged, prompt_tokens, step_time)
        it = IterationStats(num_prompt_tokens=sum(prompt_tokens.values()), num_generation_tokens=sum(len(o.new_token_ids) for o in outputs),
                            num_batched_tokens=sched.total_num_scheduled_tokens,
                            num_seqs=len(sched.num_scheduled_tokens), num_preempted=len(sched.preempted_request_ids),
                            schedule_time=t1 - t0, forward_time=t2 - t1, step_time=step_time,
                            num_drafts=spec.num_drafts, num_draft_tokens=spec.num_draft_tokens,
                            num_accepted_tokens=spec.num_accepted_tokens,
                            accepted_per_position=spec.accepted_per_position, expert_load=result.expert_load,
                            kv_transfer=self.scheduler.connector.take_stats())
        return EngineCoreOutputs(outputs, finished, it)

    def _fail_requests(self, error: RequestStepError) -> EngineCoreOutputs:
        """The executor failed these requests: end them (blocks freed now); the step's other
        requests did not advance, so the next schedule() runs their tokens again."""
        logger.error("the step failed for %s: %s; serving the others", ", ".join(error.request_ids), error)
        outputs, finished = [], []
        for rid in error.request_ids:
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            self.scheduler.finish_request(req, FinishReason.ERROR)
            finished.append(req)
            outputs.append(EngineCoreOutput(rid, [], None, FinishReason.ERROR, None, req.num_cached_tokens, req.events))
        if not outputs:  # it names nobody we know: retrying the step would fail the same way forever
            raise RuntimeError(f"executor failed a step: {error}") from error
        return EngineCoreOutputs(outputs, finished, IterationStats.idle())

    def _verify_drafts(self, sched: SchedulerOutput, result: ModelRunnerOutput,
                       step_stats: SpecDecodingStats) -> dict[str, int]:
        """How many of each request's draft tokens the executor rejected (it returns the accepted
        drafts followed by one sampled token)."""
        rejected = {}
        for i, rid in enumerate(result.req_ids):
            drafts = sched.spec_token_ids.get(rid)
            if drafts:
                accepted = len(result.sampled_token_ids[i]) - 1
                if not 0 <= accepted <= len(drafts):
                    raise RuntimeError(f"executor returned {accepted + 1} tokens for {rid!r} with {len(drafts)} drafts")
                rejected[rid] = len(drafts) - accepted
                self.scheduler.requests[rid].spec_stats.observe(len(drafts), accepted)
                step_stats.observe(len(drafts), accepted)
        return rejected

    def _prompt_tokens_per_request(self, sched: SchedulerOutput) -> dict[str, int]:
        reqs = self.scheduler.requests
        return {rid: min(n, max(0, reqs[rid].num_prompt_tokens - reqs[rid].num_computed_tokens))
                for rid, n in sched.num_scheduled_tokens.items()}

    @staticmethod
    def _charge_step(sched: SchedulerOutput, requests: list[Request], prompt_tokens: dict[str, int],
                     step_time: float) -> None:
        """Each request of the step is charged its share of the step's time, by tokens (the cost
        ledger's device-seconds); the shares of one step sum to its step_time, so a request's
        charges sum to the engine's busy seconds over all requests. Prompt tokens go to the
        prefill part, the rest (decode, draft verification) to the decode part."""
        total = sched.total_num_scheduled_tokens
        if total <= 0 or step_time <= 0:
            return
        per_token = step_time / total
        for req in requests:
            n = sched.num_scheduled_tokens[req.request_id]
            n_prompt = prompt_tokens[req.request_id]
            req.events.prefill_device_seconds += per_token * n_prompt
            req.events.decode_device_seconds += per_token * (n - n_prompt)

    def _append_sampled(self, result: ModelRunnerOutput, now: float) -> tuple[list[EngineCoreOutput], list[Request]]:
        outputs, finished = [], []
        prompt_lps = dict(result.prompt_logprobs or {})
        for i, rid in enumerate(result.req_ids):
            req = self.scheduler.requests[rid]
            new_tokens: list[int] = []
            for token in result.sampled_token_ids[i]:
                req.append_token(token, now)
                new_tokens.append(token)
                reason, stop_reason = self._check_stop(req, token)
                if reason is not None:
                    req.stop_reason = stop_reason
                    self.scheduler.finish_request(req, reason)
                    finished.append(req)
                    break
            if req.finish_reason is None and result.spec_token_ids is not None:
                req.spec_token_ids = self._trim_drafts(req, result.spec_token_ids[i])
            lps = result.logprobs[i] if result.logprobs is not None else None
            outputs.append(EngineCoreOutput(rid, new_tokens, lps[:len(new_tokens)] if lps is not None else None,
                                            req.finish_reason, req.stop_reason, req.num_cached_tokens, req.events,
                                            req.spec_stats if req.spec_stats.num_drafts else None,
                                            prompt_lps.pop(rid, None), req.kv_transfer_params))
        for rid, plp in prompt_lps.items():  # a prompt chunk that did not sample yet
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            outputs.append(EngineCoreOutput(rid, [], None, None, None, req.num_cached_tokens, req.events,
                                            prompt_logprobs=plp))
        return outputs, finished

    def _adopt_first_tokens(self, loaded: list[Request], now: float, outputs: list[EngineCoreOutput],
                            finished: list[Request]) -> None:
        """Requests whose prompt KV arrived from a prefill engine take the token it sampled as
        their first (see tokenmill/disagg/handover_scheduler.py)."""
        for req in loaded:
            token = int(req.params.kv_transfer_params["first_token_id"])
            req.append_token(token, now)
            reason, stop_reason = self._check_stop(req, token)
            if reason is not None:
                req.stop_reason = stop_reason
                self.scheduler.finish_request(req, reason)
                finished.append(req)
            outputs.append(EngineCoreOutput(req.request_id, [token], None, req.finish_reason, req.stop_reason,
                                            req.num_cached_tokens, req.events))

    def _trim_drafts(self, req: Request, drafts: list[int]) -> list[int]:
        """No draft past max_tokens or the context: the step after them would not need it."""
        room = min(req.max_tokens - req.num_output_tokens, self.scheduler.config.max_model_len - req.num_tokens) - 1
        return list(drafts[:max(0, room)])

    def _check_stop(self, req: Request, token: int) -> tuple[FinishReason | None, int | None]:
        p = req.params
        if req.num_output_tokens >= p.min_tokens:
            if token == req.eos_token_id and not p.ignore_eos:
                return FinishReason.STOP, None
            if token in p.stop_token_ids:
                return FinishReason.STOP, token
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.scheduler.config.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    # -- state ----------------------------------------------------------------------------------
    def scheduler_stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    @property
    def prefix_stats(self) -> PrefixCacheStats:
        return self.kv.prefix_stats

    @property
    def num_evictions(self) -> int:
        return self.kv.pool.num_evictions

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()
