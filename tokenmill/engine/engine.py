"""LLMEngine: add_request / step / abort_request over the scheduler and the model runner."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenmill.config import EngineConfig
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import Scheduler
from tokenmill.engine.detokenizer import DetokState, IncrementalDetokenizer
from tokenmill.engine.stats import IterationStats, StatLogger
from tokenmill.models.model_config import load_model_config
from tokenmill.request import (
    CompletionOutput,
    FinishReason,
    Logprob,
    Request,
    RequestMetrics,
    RequestOutput,
)
from tokenmill.sampling_params import SamplingParams
from tokenmill.worker.model_runner import ModelRunner, resolve_dtype, set_num_threads

logger = logging.getLogger(__name__)


def resolve_model_folder(model: str | None) -> Path:
    if model is None:
        from tokenmill.models.default_model import resolve_default_model
        return resolve_default_model()
    path = Path(model)
    if path.suffix == ".gguf":
        from tokenmill.models.gguf_convert import gguf_to_hf_folder
        return gguf_to_hf_folder(path)
    if not path.is_dir():
        raise ValueError(f"model must be a Hugging Face folder or a .gguf file; got {model!r}")
    return path


@dataclass
class _Parent:
    """A user request; it fans out into n child sequences."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    detok: list[DetokState]
    error: str | None = None
    finished_children: int = 0
    extra: dict = field(default_factory=dict)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **kwargs) -> None:
        self.config = config = config or EngineConfig(**kwargs)
        set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        folder = resolve_model_folder(config.model)
        self.model_folder = folder
        self.model_cfg = load_model_config(folder)
        self.tokenizer = _load_tokenizer(config.tokenizer or folder)
        self.max_model_len = self._max_model_len()
        self.dtype = resolve_dtype(config.dtype, self.model_cfg)
        self.runner = ModelRunner(self.model_cfg, str(folder), self.dtype, self.max_model_len,
                                  config.block_size, config.kv_cache_memory_gb, config.attention_backend,
                                  config.num_kv_blocks, kv_cache_dtype=config.kv_cache_dtype)
        self.kv = KVCacheManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                 extra_key=f"{folder}|{self.dtype}|{config.kv_cache_dtype}")
        self.scheduler = Scheduler(config.scheduler_config(self.max_model_len), self.kv)
        self.detokenizer = IncrementalDetokenizer(self.tokenizer)
        self.eos_token_id = self.tokenizer.eos_token_id
        if self.eos_token_id is None and self.model_cfg.eos_token_ids:
            self.eos_token_id = self.model_cfg.eos_token_ids[0]
        self.parents: dict[str, _Parent] = {}
        self.stat_loggers: list[StatLogger] = []
        # False: step() returns only finished requests (offline use skips per-step output building)
        self.stream_outputs = True
        self._ids = itertools.count()
        self.model_name = config.served_model_name or (Path(config.model).stem if config.model
                                                       else "SmolLM2-135M-Instruct")

    def _max_model_len(self) -> int:
        cfg = self.model_cfg
        limit = cfg.max_position_embeddings
        if cfg.sliding_window:
            limit = min(limit, cfg.sliding_window)  # no sliding-window attention: stay inside it
        if self.config.max_model_len is not None:
            if self.config.max_model_len > limit:
                raise ValueError(f"max_model_len={self.config.max_model_len} exceeds the model's limit {limit}")
            return self.config.max_model_len
        return limit

    # -- requests ---------------------------------------------------------------------------------
    def next_request_id(self) -> str:
        return str(next(self._ids))

    def add_request(self, request_id: str | None, prompt: str | list[int] | dict,
                    params: SamplingParams | None = None, arrival_time: float | None = None) -> str:
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else self.next_request_id()
        if request_id in self.parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        text, token_ids = self._tokenize(prompt)
        bad_stops = [t for t in params.stop_token_ids if not 0 <= t < self.model_cfg.vocab_size]
        if bad_stops:
            raise ValueError(f"stop_token_ids must be in [0, {self.model_cfg.vocab_size}); got {bad_stops[:3]}")
        max_tokens = self._check_lengths(token_ids, params)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        children = [Request(request_id if params.n == 1 else f"{request_id}#{i}", token_ids, params,
                            self.eos_token_id, arrival, max_tokens, parent_id=request_id, index=i)
                    for i in range(params.n)]
        detok = [self.detokenizer.start(token_ids, params.stop_list, params.skip_special_tokens)
                 for _ in children]
        self.parents[request_id] = _Parent(request_id, text, token_ids, children, detok)
        for child in children:
            self.scheduler.add_request(child)
        return request_id

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:  # the ids are used; a "prompt" text given too is kept
                return prompt.get("prompt"), self._tokenize(list(prompt["prompt_token_ids"]))[1]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        token_ids = list(prompt)
        if not token_ids:
            raise ValueError("prompt_token_ids must not be empty")
        vocab = self.model_cfg.vocab_size
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids must be integers in [0, {vocab}); got {bad[:3]}")
        return None, token_ids

    def _check_lengths(self, token_ids: list[int], params: SamplingParams) -> int:
        n = len(token_ids)
        if n >= self.max_model_len:
            raise ValueError(f"prompt has {n} tokens but max_model_len is {self.max_model_len} "
                             "(the prompt plus at least one output token must fit)")
        room = self.max_model_len - n
        max_tokens = min(params.max_tokens or room, room)
        capacity = self.kv.num_blocks * self.kv.block_size
        if n + max_tokens > capacity:
            raise ValueError(f"request needs up to {n + max_tokens} tokens of KV cache but the whole cache "
                             f"holds {capacity}; lower max_tokens or raise kv_cache_memory_gb")
        return max_tokens

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        aborted = [c for c in parent.children if not c.is_finished]
        for child in parent.children:
            if not child.is_finished:
                self.scheduler.finish_request(child, FinishReason.ABORT)
            self.runner.sampler.forget(child.request_id)
        self.log_stats(aborted)

    def log_stats(self, finished: list[Request] | None = None) -> None:
        """Report gauges outside a step (after aborts), with requests that ended there."""
        self._log_stats(IterationStats(0, 0, 0, 0, 0, 0.0, 0.0, 0.0), [], finished or [])

    def num_waiting_requests(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.kv.block_size

    def has_unfinished_requests(self) -> bool:
        return bool(self.parents)

    def get_num_unfinished_requests(self) -> int:
        return len(self.parents)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.monotonic()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        t1 = time.monotonic()
        sample_reqs, sampled = self.runner.execute(sched)
        t2 = time.monotonic()
        num_prompt = sum(min(n, max(0, r.num_prompt_tokens - r.num_computed_tokens)) for r, n in sched.scheduled)
        self.scheduler.update_after_step(sched)
        touched: dict[str, _Parent] = {}
        for i, req in enumerate(sample_reqs):
            self._append(req, sampled.token_ids[i], sampled.logprobs[i], t2)
            touched[req.parent_id] = self.parents[req.parent_id]
        outputs = [self._make_output(p) for p in touched.values()
                   if self.stream_outputs or p.finished_children == len(p.children)]
        for p in touched.values():
            if p.finished_children == len(p.children):
                del self.parents[p.request_id]
        self._log_stats(IterationStats(
            num_prompt_tokens=num_prompt,
            num_generation_tokens=len(sample_reqs), num_batched_tokens=sched.num_batched_tokens,
            num_seqs=len(sched.scheduled), num_preempted=len(sched.preempted),
            schedule_time=t1 - t0, forward_time=t2 - t1, step_time=time.monotonic() - t0),
            [c for p in touched.values() if p.request_id not in self.parents for c in p.children])
        return outputs

    def _append(self, req: Request, token: int, logprobs, now: float) -> None:
        req.append_token(token, now)
        if logprobs is not None:
            req.logprobs.append(logprobs)
        parent = self.parents[req.parent_id]
        st = parent.detok[req.index]
        self.detokenizer.add_token(st, token)
        reason, stop_reason = self._check_stop(req, token, st)
        if reason is not None:
            req.stop_reason = stop_reason
            self.scheduler.finish_request(req, reason)
            self.runner.sampler.forget(req.request_id)
            parent.finished_children += 1

    def _check_stop(self, req: Request, token: int, st: DetokState):
        p = req.params
        if req.num_output_tokens >= p.min_tokens:
            if token == req.eos_token_id and not p.ignore_eos:
                return FinishReason.STOP, None
            if token in p.stop_token_ids:
                return FinishReason.STOP, token
            if st.stop_hit is not None:
                return FinishReason.STOP, st.stop_hit
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def _make_output(self, parent: _Parent) -> RequestOutput:
        outs = [self._completion(req, st) for req, st in zip(parent.children, parent.detok)]
        first = parent.children[0]
        ev = first.events
        metrics = RequestMetrics(ev.arrival, ev.first_scheduled, ev.first_token, ev.last_token, ev.finished,
                                 sum(c.events.num_preemptions for c in parent.children))
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, outs,
                             finished=parent.finished_children == len(parent.children),
                             num_cached_tokens=first.num_cached_tokens, metrics=metrics)

    def _completion(self, req: Request, st: DetokState) -> CompletionOutput:
        done = req.is_finished
        text = self.detokenizer.visible_text(st, done, req.params.include_stop_str_in_output)
        logprobs, cumulative = None, None
        if req.params.logprobs is not None:
            logprobs = [self._logprob_dict(tok, lp) for tok, lp in zip(req.output_token_ids, req.logprobs)]
            cumulative = sum(lp[0] for lp in req.logprobs)
        return CompletionOutput(req.index, text, req.output_token_ids, cumulative, logprobs,
                                req.finish_reason.value if done and req.finish_reason else None,
                                req.stop_reason)

    def _logprob_dict(self, token: int, lp) -> dict[int, Logprob]:
        chosen, alts = lp
        out = {tid: Logprob(v, rank + 1, self.tokenizer.decode([tid])) for rank, (tid, v) in enumerate(alts)}
        if token not in out:
            out[token] = Logprob(chosen, None, self.tokenizer.decode([token]))
        return out

    def _log_stats(self, it: IterationStats, finished: list[Request], extra: list[Request] = ()) -> None:
        if not self.stat_loggers:
            return
        sched_stats = self.scheduler.stats()
        for lg in self.stat_loggers:
            lg.record(sched_stats, it, [*finished, *extra], self.kv.prefix_stats, self.kv.pool.num_evictions)

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset_prefix_cache()


def _load_tokenizer(path):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised with the path named
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: {e}") from e
