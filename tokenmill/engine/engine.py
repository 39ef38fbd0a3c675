"""LLMEngine: the frontend over the torch-free EngineCore. It owns what the core does not: prompts
and text (tokenize, detokenize, stop strings), the fan-out of one request into n samples, the
RequestOutputs users see, and the stat loggers. The core owns the step, the scheduler, the KV cache
and the request lifecycle; the ModelRunner is its executor."""
from __future__ import annotations

import copy
import dataclasses
import gc
import itertools
import logging
from dataclasses import dataclass, field

from tokenmill.config import EngineConfig
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.kv_events import KVEventLog
from tokenmill.core.outputs import EngineCoreOutput, IterationStats, PromptLogprobs, SampledLogprobs
from tokenmill.engine.detokenizer import DetokState, IncrementalDetokenizer
from tokenmill.engine.ended_usage import EndedUsage, RecentMap
from tokenmill.engine.errors import EngineSleepingError
from tokenmill.engine.generation_config import eos_ids, read_generation_config, sampling_defaults
from tokenmill.engine.resolve import resolve_config
from tokenmill.engine.tokenizer import load_tokenizer
from tokenmill.engine.validation import RequestValidationError, check_request, check_structured_outputs
from tokenmill.metrics.stats import StatLogger
from tokenmill.request import (
    CompletionOutput,
    FinishReason,
    Logprob,
    Request,
    RequestEvents,
    RequestMetrics,
    RequestOutput,
    SpecDecodingStats,
)
from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.backend import GrammarCompiler, get_compiler
from tokenmill.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class _Sample:
    """One of the n outputs of a request, as the frontend sees it."""
    request_id: str  # the core's id
    index: int
    params: SamplingParams
    detok: DetokState
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None  # built once per token
    cumulative_logprob: float = 0.0
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    events: RequestEvents | None = None
    spec_stats: SpecDecodingStats | None = None
    kv_transfer_params: dict | None = None


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    samples: list[_Sample]
    num_finished: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # filled in prompt order

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.samples)


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word's token ids alone and, where a leading space makes a different token of the
    same length, after a space (mid-text), as vLLM bans them."""
    out = []
    for word in words:
        alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out.append(alone)
        if spaced and spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(spaced)
    return out


def freeze_startup_heap() -> None:
    """Move every object alive after loading (torch, transformers, the model: ~600k objects) out
    of the collector's reach, as vLLM does. Otherwise each full collection, which bursts of small
    records (logprob entries) trigger, walks them all: 0.48 s per collection, measured during a
    14k-token prompt_logprobs pass that took 1.0 s in all (0.54 s frozen)."""
    gc.collect()
    gc.freeze()


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **kwargs) -> None:
        self.engine_config = config or EngineConfig(**kwargs)
        self.config = cfg = resolve_config(self.engine_config)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer)
        self.runner = ModelRunner(cfg)
        kv = KVCacheManager(cfg.cache.num_blocks, cfg.cache.block_size, cfg.cache.enable_prefix_caching,
                            extra_key=cfg.cache.block_hash_key, sliding_window=cfg.cache.sliding_window)
        kv.pool.events = KVEventLog()  # stored/evicted block hashes, for KV-aware routers
        self.core = EngineCore(cfg.scheduler, kv, self.runner, kv_connector=self._kv_connector(cfg))
        self.detokenizer = IncrementalDetokenizer(self.tokenizer)
        self.eos_token_id = self.tokenizer.eos_token_id
        if self.eos_token_id is None and cfg.model.arch.eos_token_ids:
            self.eos_token_id = cfg.model.arch.eos_token_ids[0]
        # the model's other end ids (generation_config.json, else config.json, as vLLM) end a
        # sample as stop token ids do; its sampling keys are LLM's defaults
        generation_config = read_generation_config(cfg.model.path)
        model_eos = eos_ids(generation_config) or list(cfg.model.arch.eos_token_ids)
        self.extra_eos_ids = sorted({t for t in model_eos if t != self.eos_token_id and 0 <= t < self.vocab_size})
        self.generation_defaults = sampling_defaults(generation_config)
        self.parents: dict[str, _Parent] = {}
        self._samples: dict[str, tuple[_Parent, _Sample]] = {}  # core request id -> its parent and sample
        self.stat_loggers: list[StatLogger] = []
        self.ended_usage: RecentMap[str, EndedUsage] = RecentMap()  # the last requests' usage, aborted ones too (fleet billing)
        # False: step() returns only finished requests (offline use skips per-step output building)
        self.stream_outputs = True
        # True (LLM, as vLLM offline): a max_tokens past the context ends the output there; False
        # (the server, as OpenAI): such a request is refused with context_length_exceeded
        self.clamp_max_tokens = False
        self._ids = itertools.count()
        freeze_startup_heap()


    @staticmethod
    def _kv_connector(cfg):
        """The KV connector's scheduler half for a prefill or decode role (None: role both)."""
        if cfg.kv_role == "both":
            return None
        from tokenmill.disagg.handover_scheduler import HandoverConnectorScheduler
        return HandoverConnectorScheduler(cfg.cache.block_size, cfg.cache.block_hash_key, cfg.kv_transfer_timeout_s,
                                          cfg.model.arch.vocab_size)

    # -- facts ----------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.config.model.served_name

    @property
    def max_model_len(self) -> int:
        return self.config.model.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.config.model.arch.vocab_size

    @property
    def kv_capacity_tokens(self) -> int:
        """The longest request the cache can hold. With a sliding window in every layer a request
        holds at most the blocks of its window plus one step's tokens, whatever its length."""
        cache, sched = self.config.cache, self.config.scheduler
        if cache.sliding_window is not None:
            at_once = cache.sliding_window + sched.max_num_batched_tokens + sched.num_lookahead_tokens
            if (at_once // cache.block_size + 2) * cache.block_size <= cache.capacity_tokens:
                return self.max_model_len
        return cache.capacity_tokens

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Structured outputs' compiler and cache (shared with the runner in this process)."""
        return get_compiler(self.config.model.tokenizer, self.vocab_size, self.eos_token_id)

    # -- requests ---------------------------------------------------------------------------------
    def next_request_id(self) -> str:
        return str(next(self._ids))

    def add_request(self, request_id: str | None, prompt: str | list[int] | dict,
                    params: SamplingParams | None = None, arrival_time: float | None = None) -> str:
        """Validate and queue one request (n samples). Raises RequestValidationError (a ValueError
        naming the field) and adds nothing when the request is invalid."""
        if self.is_sleeping:
            raise EngineSleepingError("the engine is sleeping (its KV cache is released): POST /wake_up first")
        params = self._engine_params(params or SamplingParams())
        request_id = request_id if request_id is not None else self.next_request_id()
        if request_id in self.parents:
            raise RequestValidationError(f"request_id {request_id!r} is already in use", "request_id")
        text, token_ids = self.tokenize_prompt(prompt)
        max_tokens = check_request(token_ids, params, self.vocab_size, self.max_model_len, self.kv_capacity_tokens,
                                   self.clamp_max_tokens)
        if params.max_tokens is None and "max_tokens" in self.generation_defaults:  # the model's max_new_tokens
            max_tokens = min(max_tokens, self.generation_defaults["max_tokens"])
        if params.structured_outputs is not None:
            check_structured_outputs(params, self.grammar_compiler)
        arrival = arrival_time if arrival_time is not None else self.core.clock()
        parent = _Parent(request_id, text, token_ids, [], prompt_logprobs=[None] if params.prompt_logprobs is not None
                         else None)
        for i in range(params.n):
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            # sample i of a seeded request draws from seed + i: distinct, reproducible samples
            child_params = params
            if params.seed is not None and params.n > 1:
                child_params = copy.copy(params)  # not replace(): its __post_init__ would read seed -1 as None
                child_params.n, child_params.seed = 1, params.seed + i
            detok = self.detokenizer.start(token_ids, params.stop_list, params.skip_special_tokens)
            sample = _Sample(rid, i, child_params, detok, logprobs=[] if params.logprobs is not None else None)
            parent.samples.append(sample)
        self.parents[request_id] = parent
        for sample in parent.samples:
            self._samples[sample.request_id] = (parent, sample)
            self.core.add_request(Request(sample.request_id, token_ids, sample.params, self.eos_token_id, arrival,
                                          max_tokens))
        return request_id

    def _engine_params(self, params: SamplingParams) -> SamplingParams:
        """What the engine adds to a request's params: the model's other end ids, bad words' token ids."""
        missing = [t for t in self.extra_eos_ids if t not in params.stop_token_ids]
        if missing and not params.ignore_eos:
            params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids + missing)
        if params.bad_words and params.bad_words_token_ids is None:
            params = dataclasses.replace(params, bad_words_token_ids=bad_words_token_ids(self.tokenizer,
                                                                                         params.bad_words))
        return params

    def tokenize_prompt(self, prompt) -> tuple[str | None, list[int]]:
        """A prompt is text, token ids, or a dict with "prompt" and/or "prompt_token_ids" (both:
        the ids are used, the text is kept for the output)."""
        text = None
        if isinstance(prompt, dict):
            if prompt.get("multi_modal_data"):
                raise RequestValidationError("multi_modal_data: this engine runs text-only models", "prompt")
            if "prompt_token_ids" not in prompt and "prompt" not in prompt:
                raise RequestValidationError("prompt dict needs 'prompt' or 'prompt_token_ids'", "prompt")
            text = prompt.get("prompt")
            prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else text
        if isinstance(prompt, str):
            if not prompt:
                raise RequestValidationError("prompt must not be empty", "prompt")
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if not isinstance(prompt, (list, tuple)):
            raise RequestValidationError(f"prompt must be a string, a list of token ids or a dict; got "
                                         f"{type(prompt).__name__}", "prompt")
        return text, list(prompt)

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        ended = self.core.finish_requests([s.request_id for s in parent.samples], FinishReason.ABORT)
        events = {r.request_id: r.events for r in ended}  # a sample still in prefill has no output yet
        self._record_usage(parent, [s.events or events.get(s.request_id) for s in parent.samples], aborted=True)
        for sample in parent.samples:
            self._samples.pop(sample.request_id, None)
        self._log_stats(IterationStats.idle(), ended)

    def _record_usage(self, parent: _Parent, events: list[RequestEvents | None], aborted: bool) -> None:
        self.ended_usage.record(parent.request_id, EndedUsage.of(
            len(parent.prompt_token_ids), sum(len(s.token_ids) for s in parent.samples),
            parent.samples[0].num_cached_tokens, events, aborted))

    def log_stats(self) -> None:
        """Report gauges outside a step (after aborts)."""
        self._log_stats(IterationStats.idle(), [])

    def num_waiting_requests(self) -> int:
        return self.core.num_waiting_requests

    def has_unfinished_requests(self) -> bool:
        """Requests in flight, or KV hand-overs whose blocks are still held (the loop polls them)."""
        return bool(self.parents) or self.core.has_pending_kv_transfers()

    def get_num_unfinished_requests(self) -> int:
        return len(self.parents)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        result = self.core.step()
        finished = list(result.finished_requests)
        touched: dict[str, _Parent] = {}
        for out in result.outputs:
            parent, sample = self._samples[out.request_id]
            if out.prompt_logprobs is not None:
                self._add_prompt_logprobs(parent, out.prompt_logprobs)
            if not out.new_token_ids and out.finish_reason is None:
                continue  # a prompt chunk: nothing to show yet
            finished += self._process(sample, out)
            if sample.finish_reason is not None:
                parent.num_finished += 1
                del self._samples[out.request_id]
            touched[parent.request_id] = parent
        outputs = [self._make_output(p) for p in touched.values() if self.stream_outputs or p.finished]
        for p in touched.values():
            if p.finished:
                del self.parents[p.request_id]
                self._record_usage(p, [s.events for s in p.samples], aborted=False)
        self._log_stats(result.iteration, finished)
        return outputs

    def _process(self, sample: _Sample, out: EngineCoreOutput) -> list[Request]:
        """Fold one core output into the sample: tokens, text, logprobs; a stop string ends it.
        Returns the core requests this ended (for statistics)."""
        sample.events, sample.num_cached_tokens = out.events, out.num_cached_tokens
        sample.spec_stats = out.spec_stats or sample.spec_stats
        sample.kv_transfer_params = out.kv_transfer_params or sample.kv_transfer_params
        params = sample.params
        last = len(out.new_token_ids) - 1
        # EOS or a stop token id ends the sample without its text, unless include_stop_str_in_output (vLLM)
        drop_last_text = out.finish_reason == FinishReason.STOP and not params.include_stop_str_in_output
        for i, token in enumerate(out.new_token_ids):
            sample.token_ids.append(token)
            if out.new_logprobs is not None and sample.logprobs is not None:
                self._add_logprobs(sample, token, out.new_logprobs[i])
            if i == last and drop_last_text:
                break
            # stop strings count from the token after the first min_tokens (vLLM)
            self.detokenizer.add_token(sample.detok, token, check_stops=len(sample.token_ids) > params.min_tokens)
            if sample.detok.stop_hit is not None:
                break  # tokens after the one completing a stop string (drafts of one step) are dropped
        sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason
        if sample.detok.stop_hit is None:
            return []
        # a stop string ends the sample (and wins over the length limit reached on the same token)
        ended = [] if sample.finish_reason is not None else self.core.finish_requests(
            [sample.request_id], FinishReason.STOP, sample.detok.stop_hit)
        sample.finish_reason, sample.stop_reason = FinishReason.STOP, sample.detok.stop_hit
        return ended

    def _add_logprobs(self, sample: _Sample, token: int, lp: SampledLogprobs) -> None:
        sample.logprobs.append(self._logprob_entry(token, lp))
        sample.cumulative_logprob += lp.logprob

    def _add_prompt_logprobs(self, parent: _Parent, plp: PromptLogprobs) -> None:
        """Entries arrive in prompt order, chunk by chunk; positions already filled (a prompt
        recomputed after a preemption, or the same prompt from another of the n samples) are skipped."""
        have = parent.prompt_logprobs
        ids = parent.prompt_token_ids
        for pos in range(len(have), plp.start + len(plp.entries)):
            have.append(self._logprob_entry(ids[pos], plp.entries[pos - plp.start]))

    def _logprob_entry(self, token: int, lp: SampledLogprobs) -> dict[int, Logprob]:
        """vLLM's entry: the token itself first (with its own rank), then the top alternatives (rank 1..k)."""
        text = self.detokenizer.token_text
        top = {tid: Logprob(v, rank, text(tid)) for rank, (tid, v) in enumerate(lp.top, start=1)}
        chosen = top.pop(token, None) or Logprob(lp.logprob, lp.rank, text(token))
        return {token: chosen, **top}

    def _make_output(self, parent: _Parent) -> RequestOutput:
        outs = [self._completion(s) for s in parent.samples]
        ev = parent.samples[0].events
        metrics = None
        if ev is not None:
            stats = [s.spec_stats for s in parent.samples if s.spec_stats is not None]
            spec_stats = SpecDecodingStats.merged(stats) if stats else None  # a copy: the core's keeps changing
            evs = [s.events for s in parent.samples if s.events]
            metrics = RequestMetrics(ev.arrival, ev.first_scheduled, ev.first_token, ev.last_token, ev.finished,
                                     sum(e.num_preemptions for e in evs), spec_stats,
                                     prefill_device_seconds=sum(e.prefill_device_seconds for e in evs),
                                     decode_device_seconds=sum(e.decode_device_seconds for e in evs))
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, parent.prompt_logprobs, outs,
                             finished=parent.finished, num_cached_tokens=parent.samples[0].num_cached_tokens,
                             metrics=metrics,
                             kv_transfer_params=parent.samples[0].kv_transfer_params)

    def _completion(self, s: _Sample) -> CompletionOutput:
        done = s.finish_reason is not None
        text = self.detokenizer.visible_text(s.detok, done, s.params.include_stop_str_in_output)
        logprobs = list(s.logprobs) if s.logprobs is not None else None
        return CompletionOutput(s.index, text, list(s.token_ids), s.cumulative_logprob if logprobs is not None else None,
                                logprobs, s.finish_reason.value if done else None, s.stop_reason)

    def _log_stats(self, it: IterationStats, finished: list[Request]) -> None:
        if not self.stat_loggers:
            return
        sched_stats = self.core.scheduler_stats()
        for lg in self.stat_loggers:
            try:
                lg.record(sched_stats, it, finished, self.core.prefix_stats, self.core.num_evictions)
            except Exception:  # a broken metrics sink must not stop serving; say so every time
                logger.exception("stat logger %s failed", type(lg).__name__)

    def reset_prefix_cache(self) -> bool:
        return self.core.reset_prefix_cache()

    # -- sleep mode -----------------------------------------------------------------------------
    @property
    def is_sleeping(self) -> bool:
        return not self.runner.kv_caches

    def sleep(self) -> None:
        """vLLM's sleep mode, level 1: the weights stay in host memory, the KV cache is released
        (and the prefix cache forgotten with it). Only an engine with no unfinished request sleeps;
        requests added while it sleeps are refused until `wake_up()`."""
        if self.has_unfinished_requests():
            raise RuntimeError(f"cannot sleep: {self.get_num_unfinished_requests()} requests are unfinished")
        self.core.reset_prefix_cache()
        self.runner.release_kv_cache()
        gc.collect()

    def wake_up(self) -> None:
        self.runner.allocate_kv_cache()
