"""Token-budget scheduler: no prefill/decode phases, just "how many tokens each request runs now".

Each step: running requests first (decodes and unfinished prefill chunks), then waiting requests
fill what is left of the budget (Sarathi-style chunked prefill). When a running request cannot grow,
the most recently admitted one is preempted by recompute. Torch-free: sim/ reuses it.

The output is plain data (`SchedulerOutput`): the executor sees a request in full the first time it
is scheduled (and again after a preemption), then only its new block ids.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from tokenmill.request import FinishReason, Request, RequestStatus

if TYPE_CHECKING:
    from tokenmill.disagg.connector import KVConnectorOutput, KVConnectorScheduler


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # >0: cap on one prompt's chunk per step
    num_lookahead_tokens: int = 0  # KV slots reserved past the known tokens (speculative decoding)
    # A step that ends one prompt takes no further prompt chunks (decodes still ride along): the
    # first token of that prompt is not held back by a newcomer's prefill packed into its step.
    one_prompt_end_per_step: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("long_prefill_token_threshold", "num_lookahead_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    block_fill: float = 0.0  # tokens stored / slots allocated in used blocks
    num_preemptions_total: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager,
                 clock: Callable[[], float] = time.monotonic, connector: KVConnectorScheduler | None = None) -> None:
        self.config = config
        self.kv = kv
        self.clock = clock
        if connector is None:
            from tokenmill.disagg.connector import NullKVConnector
            connector = NullKVConnector()
        self.connector = connector  # the KV connector's scheduler half (tokenmill/disagg/connector.py)
        self.waiting_for_remote_kv: dict[str, Request] = {}  # their KV is being loaded from another engine
        self.sending: dict[str, Request] = {}  # finished; blocks held until the receiver has them
        self._released_early: set[str] = set()  # the receiver had them before the request finished
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._sent_blocks: dict[str, int] = {}  # request id -> block ids the executor holds now
        self._known: set[str] = set()  # request ids the executor has seen (until they finish)
        self._finished_ids: set[str] = set()  # ended since the last executed schedule()
        self._preempted_ids: list[str] = []  # preempted in a schedule() that ran nothing
        self._prompt_ended = False

    # -- queue management -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif self.waiting_for_remote_kv.pop(request.request_id, None) is None:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.events.finished = self.clock()
        delay_free, request.kv_transfer_params = self.connector.request_finished(
            request, self.kv.block_ids(request.request_id))
        if delay_free and request.request_id not in self._released_early:
            self.sending[request.request_id] = request
        else:
            self._released_early.discard(request.request_id)
            self.kv.free(request)
        self.requests.pop(request.request_id, None)
        self._sent_blocks.pop(request.request_id, None)
        if request.request_id in self._known:
            self._known.discard(request.request_id)
            self._finished_ids.add(request.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.waiting_for_remote_kv)

    def has_pending_kv_transfers(self) -> bool:
        """Blocks held for a receiver, or connector work queued: the step loop must keep polling."""
        return bool(self.sending) or self.connector.has_pending_work()

    # -- the step decision --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_request_ids=self._finished_ids, preempted_request_ids=self._preempted_ids)
        self._finished_ids, self._preempted_ids = set(), []
        preemptions = self.num_preemptions
        self._prompt_ended = False  # this step runs some prompt's last chunk (one_prompt_end_per_step)
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if self.num_preemptions == preemptions:  # under memory pressure nobody new is admitted
            self._schedule_waiting(out, budget, self.clock())
        out.num_unfinished_requests = len(self.running) + len(self.waiting)
        out.kv_connector_metadata = self.connector.build_connector_meta(
            out.num_scheduled_tokens, self.requests, {rid: self.kv.block_ids(rid) for rid in out.num_scheduled_tokens})
        return out

    def defer(self, out: SchedulerOutput) -> None:
        """`out` scheduled nothing and was not executed: its news goes out with the next one."""
        self._finished_ids |= out.finished_request_ids
        self._preempted_ids += out.preempted_request_ids

    def _chunk(self, req: Request, budget: int) -> int:
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if self.config.long_prefill_token_threshold > 0:
            n = min(n, self.config.long_prefill_token_threshold)
        return n

    @staticmethod
    def _drafts(req: Request, n: int, budget: int) -> list[int]:
        """Draft tokens to verify after a request's last known token, within the budget."""
        if not req.spec_token_ids or req.num_computed_tokens + n != req.num_tokens:
            return []
        return req.spec_token_ids[:budget - n]

    @staticmethod
    def _is_prefill(req: Request, start: int) -> bool:
        """More than the last known token left to compute: a prompt (or a recompute) chunk."""
        return start + 1 < req.num_tokens

    def _closed_to_prefill(self) -> bool:
        return self._prompt_ended and self.config.one_prompt_end_per_step

    def _note_prompt_end(self, req: Request, start: int, n: int) -> None:
        if n > 1 and start + n == req.num_tokens:
            self._prompt_ended = True

    def _lookahead(self, req: Request, start: int, n: int) -> int:
        # lookahead slots only for a request that will sample this step
        return self.config.num_lookahead_tokens if start + n == req.num_tokens else 0

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            if n <= 0 or (self._closed_to_prefill() and self._is_prefill(req, req.num_computed_tokens)):
                i += 1
                continue
            drafts = self._drafts(req, n, budget)
            n += len(drafts)
            while not self.kv.allocate_slots(req, n, num_lookahead_tokens=self._lookahead(req, req.num_computed_tokens, n)):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                self._note_prompt_end(req, req.num_computed_tokens, n - len(drafts))
                self._emit(out, req, n)
                if drafts:
                    out.spec_token_ids[req.request_id] = drafts
                budget -= n
                i += 1
                continue
            break  # req itself was preempted: everything after it is gone too
        return budget

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.events.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        rid = req.request_id
        if self._sent_blocks.pop(rid, None) is not None:
            out.preempted_request_ids.append(rid)
        if out.num_scheduled_tokens.pop(rid, None) is not None:
            out.cached_requests = [c for c in out.cached_requests if c.request_id != rid]
            out.spec_token_ids.pop(rid, None)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if self._closed_to_prefill():
                break
            req = self.waiting[0]
            cached_blocks, num_cached = self.kv.get_computed_blocks(req)
            num_remote = self.connector.get_num_new_matched_tokens(req, num_cached)
            if num_remote > 0:
                if not self._start_remote_load(req, cached_blocks, num_cached, num_remote):
                    break
                continue
            n = min(req.num_tokens - num_cached, budget)
            if self.config.long_prefill_token_threshold > 0:
                n = min(n, self.config.long_prefill_token_threshold)
            lookahead = self._lookahead(req, num_cached, n)
            if not self.kv.allocate_slots(req, n, cached_blocks, lookahead, admit=bool(self.running)):
                break  # memory pressure: new requests wait, running ones are not evicted for them
            self.waiting.popleft()
            if req.status == RequestStatus.WAITING:  # first admission (not a resume)
                self.kv.record_prefix_query(req.num_tokens, num_cached)
                req.num_cached_tokens = num_cached
            req.num_computed_tokens = num_cached
            req.status = RequestStatus.RUNNING
            if req.events.first_scheduled is None:
                req.events.first_scheduled = now
            self.running.append(req)
            self._note_prompt_end(req, num_cached, n)
            self._emit(out, req, n)
            budget -= n

    def _start_remote_load(self, req: Request, cached_blocks: list, num_cached: int, num_remote: int) -> bool:
        """Allocate the blocks the remote KV lands in; the request waits for it (not scheduled)."""
        if not self.kv.allocate_slots(req, num_remote, cached_blocks, admit=bool(self.running)):
            return False
        self.waiting.popleft()
        self.kv.record_prefix_query(req.num_tokens, num_cached)
        req.num_cached_tokens = num_cached
        req.num_computed_tokens = num_cached
        req.status = RequestStatus.WAITING_FOR_REMOTE_KV
        self.waiting_for_remote_kv[req.request_id] = req
        self.connector.update_state_after_alloc(req, self.kv.block_ids(req.request_id), num_cached, num_remote)
        return True

    def update_from_kv_connector(self, output: KVConnectorOutput) -> list[Request]:
        """The worker half's report: loaded requests run (the landed blocks become findable by
        hash; returned, so the core adopts the sender's first token), failed ones go back to wait
        and compute their prompt, and the blocks of requests their receiver has (or that timed
        out) are freed."""
        self.connector.update_connector_output(output)
        loaded = []
        for rid, record in output.finished_recving.items():
            req = self.waiting_for_remote_kv.pop(rid, None)
            if req is not None:  # it owns its blocks: it runs from here
                req.num_computed_tokens = record.num_tokens
                self.kv.cache_blocks(req, req.num_computed_tokens)
                req.status = RequestStatus.RUNNING
                if req.events.first_scheduled is None:
                    req.events.first_scheduled = self.clock()
                self.running.append(req)
                loaded.append(req)
        for rid, reason in output.failed_recving.items():
            req = self.waiting_for_remote_kv.pop(rid, None)
            if req is not None:
                self.kv.free(req)
                req.num_computed_tokens = 0
                req.status = RequestStatus.WAITING
                self.connector.request_failed_load(req, reason)
                self.waiting.appendleft(req)
        for rid in output.finished_sending:
            req = self.sending.pop(rid, None)
            if req is not None:
                self.kv.free(req)
            elif rid in self.requests:
                self._released_early.add(rid)
        return loaded

    def _emit(self, out: SchedulerOutput, req: Request, n: int) -> None:
        rid = req.request_id
        blocks = self.kv.req_blocks[rid]
        sent = self._sent_blocks.get(rid)
        if sent is None:
            out.new_requests.append(NewRequestData(
                rid, req.prompt_token_ids, req.output_token_ids, req.params, req.eos_token_id,
                [b.block_id for b in blocks], req.num_computed_tokens))
        else:
            out.cached_requests.append(CachedRequestData(rid, [b.block_id for b in blocks[sent:]],
                                                         req.num_computed_tokens))
        self._sent_blocks[rid] = len(blocks)
        self._known.add(rid)
        out.num_scheduled_tokens[rid] = n

    def update_after_step(self, out: SchedulerOutput, num_rejected: dict[str, int]) -> None:
        """The step computed what was scheduled: advance the counters, roll back the slots of
        rejected draft tokens (their KV is garbage and is overwritten later; never cached), and
        offer the now-written full blocks to the prefix cache."""
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests.get(rid)
            if req is None:
                continue
            req.num_computed_tokens += n - num_rejected.get(rid, 0)
            self.kv.cache_blocks(req, req.num_computed_tokens)

    def stats(self) -> SchedulerStats:
        used_slots = self.kv.pool.num_used_blocks * self.kv.block_size
        stored = sum(r.num_computed_tokens for r in self.running)
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting) + len(self.waiting_for_remote_kv),
            kv_usage=self.kv.usage(),
            block_fill=min(1.0, stored / used_slots) if used_slots else 0.0,
            num_preemptions_total=self.num_preemptions)
