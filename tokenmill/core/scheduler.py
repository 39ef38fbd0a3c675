"""Token-budget scheduler: no prefill/decode phases, just "how many tokens each request runs now".

Each step: running requests first (decodes and unfinished prefill chunks), then waiting requests
fill what is left of the budget (Sarathi-style chunked prefill). When a running request cannot grow,
the most recently admitted one is preempted by recompute. Torch-free: sim/ reuses it.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.request import FinishReason, Request, RequestStatus


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0  # >0: cap on one prompt's chunk per step

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class SchedulerOutput:
    # request -> tokens to compute this step, in batch order
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    block_fill: float = 0.0  # tokens stored / slots allocated in used blocks
    num_preemptions_total: int = 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.events.finished = time.monotonic()
        self.requests.pop(request.request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step decision --------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        now = time.monotonic()
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget, now)
        for req, _ in out.scheduled:
            out.block_ids[req.request_id] = self.kv.block_ids(req.request_id)
        out.num_batched_tokens = sum(n for _, n in out.scheduled)
        return out

    def _chunk(self, req: Request, budget: int) -> int:
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if self.config.long_prefill_token_threshold > 0:
            n = min(n, self.config.long_prefill_token_threshold)
        return n

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            if n <= 0:
                i += 1
                continue
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                out.scheduled.append((req, n))
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
        req.events.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)
        out.scheduled = [(r, n) for r, n in out.scheduled if r is not req]

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            cached_blocks, num_cached = self.kv.get_computed_blocks(req)
            remaining = req.num_tokens - num_cached
            n = min(remaining, budget)
            if self.config.long_prefill_token_threshold > 0:
                n = min(n, self.config.long_prefill_token_threshold)
            if not self.kv.allocate_slots(req, n, cached_blocks, admit=bool(self.running)):
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
            out.scheduled.append((req, n))
            budget -= n

    def update_after_step(self, out: SchedulerOutput) -> None:
        for req, n in out.scheduled:
            req.num_computed_tokens += n

    def stats(self) -> SchedulerStats:
        used_slots = self.kv.pool.num_used_blocks * self.kv.block_size
        stored = sum(r.num_computed_tokens for r in self.running)
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting), kv_usage=self.kv.usage(),
            block_fill=min(1.0, stored / used_slots) if used_slots else 0.0,
            num_preemptions_total=self.num_preemptions)
