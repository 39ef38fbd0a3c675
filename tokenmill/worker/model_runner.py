"""ModelRunner: the torch Executor. Keeps its own record of each request it has been shown, turns a
SchedulerOutput into one flat batch, runs the model, samples."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from tokenmill import host_memory, malloc
from tokenmill.attention import BatchLayout, enable_batch_invariance, get_attention_backend
from tokenmill.config import TokenmillConfig
from tokenmill.core.errors import RequestStepError
from tokenmill.core.outputs import ModelRunnerOutput, PromptLogprobs
from tokenmill.core.scheduler_output import NewRequestData, SchedulerOutput
from tokenmill.engine.resolve import TORCH_DTYPES
from tokenmill.metrics.expert_load import ExpertLoad
from tokenmill.models.loader import build_model
from tokenmill.models.model_config import read_hf_config
from tokenmill.models.moe import moe_layers
from tokenmill.models.registry import get_model_class
from tokenmill.quant import quant_config
from tokenmill.sampling_params import SamplingParams
from tokenmill.spec.proposer import DraftRequest, Target, make_proposer
from tokenmill.spec.rejection import verify
from tokenmill.structured.matcher import StructuredDecoding
from tokenmill.worker.sampler import Sampler, prompt_logprobs
from tokenmill.worker.threads import ThreadController

logger = logging.getLogger(__name__)

# Test-only fault injection (off unless set): a step that schedules a request whose prompt holds
# this token id raises RequestStepError for it, as a per-request failure inside the model would.
FAULT_TOKEN_ENV = "TOKENMILL_TEST_FAULT_TOKEN"


@dataclass
class RunnerRequest:
    """What the runner knows of a request: its tokens (it appends what it samples), the blocks it
    owns and how many of its tokens have KV."""
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int
    spec_k: int = 0  # drafts to propose next (adapts to this request's recent acceptance)
    token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.token_ids = self.prompt_token_ids + self.output_token_ids

    @classmethod
    def from_new(cls, new: NewRequestData) -> RunnerRequest:
        return cls(new.request_id, list(new.prompt_token_ids), list(new.output_token_ids), new.params,
                   new.eos_token_id, list(new.block_ids), new.num_computed_tokens)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append(self, token: int) -> None:
        self.token_ids.append(token)
        self.output_token_ids.append(token)


@dataclass(frozen=True)
class PromptRows:
    """The rows of a flat batch that score prompt tokens for one request."""
    request_id: str
    row: int  # first row in the flat batch
    position: int  # its position in the sequence (it scores the prompt token at position + 1)
    targets: list[int]  # the prompt tokens scored: at position + 1, position + 2, ...
    k: int  # top alternatives


class ModelRunner:
    def __init__(self, config: TokenmillConfig) -> None:
        model, cache, device = config.model, config.cache, config.device
        self.config = config
        self.threads = ThreadController(device.num_threads, device.adaptive_threads)
        logger.info("model threads: %d (%s%s)", device.num_threads, device.threads_reason,
                    "; fewer while other processes keep these cores busy" if device.adaptive_threads else "")
        logger.info(malloc.describe())
        torch.manual_seed(device.seed)
        if device.batch_invariant:  # before the model is built: its linear methods read it
            enable_batch_invariance(device.attention_backend, model.dtype)
        self.dtype = TORCH_DTYPES[model.dtype]
        self.block_size = cache.block_size
        self.num_blocks = cache.num_blocks
        self.model = build_model(model.arch, model.path, self.dtype, model.max_model_len,
                                 quant_config(model.quantization, self.dtype, model.gguf_file,
                                              model.quant_group_size,
                                              read_hf_config(model.path).get("quantization_config")))
        self.backend = get_attention_backend(device.attention_backend)
        self.moe_layers = moe_layers(self.model)
        self.expert_load = ExpertLoad()  # since start, for benchmarks
        cls = get_model_class(model.arch.architecture)
        layer_spec = cls.kv_cache_spec(model.arch, cache.kv_cache_dtype, self.dtype, cache.block_size)
        self.kv_spec = layer_spec.with_num_blocks(cache.num_blocks)
        self.kv_caches = cls.allocate_kv_caches(model.arch, cache.kv_cache_dtype, self.dtype, cache.block_size,
                                                cache.num_blocks)
        self.kv_connector = None  # the KV connector's worker half (prefill/decode roles)
        if config.kv_role != "both":
            from tokenmill.disagg.workers import make_connector_worker
            self.kv_connector = make_connector_worker(config.kv_connector, config.kv_role, self.kv_caches,
                                                      cache.num_blocks)
            self.kv_caches = self.kv_connector.kv_caches  # shm: a prefill engine's now live in shared memory
        if cache.prefault:
            self._prefault_kv_cache()
        self.kv_bytes_per_token = cache.bytes_per_token
        self.sampler = Sampler(model.arch.vocab_size)
        self.structured = StructuredDecoding(str(model.tokenizer), model.arch.vocab_size)
        self.requests: dict[str, RunnerRequest] = {}
        self.spec = config.speculative
        self.fault_token = int(os.environ[FAULT_TOKEN_ENV]) if os.environ.get(FAULT_TOKEN_ENV) else None
        if self.fault_token is not None:
            logger.warning("TEST HOOK %s=%d: requests whose prompt holds this token fail in the model step",
                           FAULT_TOKEN_ENV, self.fault_token)
        self.proposer = None
        if self.spec is not None:
            self.proposer = make_proposer(self.spec, Target(
                self.model, self.kv_caches, self.backend, cache.block_size, cache.num_blocks, cache.kv_cache_dtype,
                self.dtype, model.max_model_len))
            logger.info("speculative decoding: %s, up to %d draft tokens, off above %d decoding requests (%s)",
                        self.spec.method, self.spec.num_speculative_tokens, self.spec.disable_by_batch_size, self.spec)
        logger.info("model %s (%s) from %s: dtype %s, quantization %s, max_model_len %d; attention backend %s, "
                    "linear %s", model.served_name, model.arch.architecture, model.gguf_file or model.path,
                    model.dtype, model.quantization, model.max_model_len, self.backend.name,
                    type(self.model.lm_head.quant_method).__name__)
        logger.info("KV cache (%s): %d blocks x %d tokens = %d tokens, %.0f bytes/token, %.2f GiB",
                    cache.kv_cache_dtype, cache.num_blocks, cache.block_size, cache.capacity_tokens,
                    cache.bytes_per_token, cache.capacity_tokens * cache.bytes_per_token / (1 << 30))
        logger.info("host memory: %s", host_memory.describe())

    # -- sleep mode (vLLM's level 1: weights stay in host memory, the KV cache is released) ------
    def release_kv_cache(self) -> None:
        """The engine calls this with no unfinished request (records left here are finished ones
        the next SchedulerOutput will name)."""
        self.kv_caches.clear()  # in place: a speculative proposer's Target shares this list

    def allocate_kv_cache(self) -> None:
        if not self.kv_caches:
            cfg = self.config
            self.kv_caches.extend(get_model_class(cfg.model.arch.architecture).allocate_kv_caches(
                cfg.model.arch, cfg.cache.kv_cache_dtype, self.dtype, cfg.cache.block_size, cfg.cache.num_blocks))
            if cfg.cache.prefault:
                self._prefault_kv_cache()

    def _prefault_kv_cache(self) -> None:
        tensors = [t for layer in self.kv_caches for t in layer]
        done = host_memory.prefault(tensors, threads=torch.get_num_threads())
        if done.supported:
            logger.info("KV cache mapped: %.2f GiB in %.1f s (no request pays a first-write page fault)",
                        done.mapped_bytes / (1 << 30), done.seconds)
        else:
            logger.info("KV cache left lazily mapped: this kernel has no MADV_POPULATE_WRITE")

    # -- Executor -------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        if self.kv_connector is None:
            return self._execute(out)
        self.kv_connector.start_load_kv(out.kv_connector_metadata)
        result = self._execute(out)
        self.kv_connector.save_kv(out.kv_connector_metadata)
        result.kv_connector_output = self.kv_connector.get_finished()
        return result

    def _execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(out)
        if out.is_empty:
            return ModelRunnerOutput([], [])
        if self.fault_token is not None:
            self._inject_fault(out)
        self.threads.before_step()
        input_ids, positions, layout, sample_idx, samples, prompt_rows = self._layout(out)
        meta = self.backend.build_metadata(layout)
        hidden = self.model(input_ids, positions, self.kv_caches, self.backend, meta)
        drafting = self.spec is not None and out.num_unfinished_requests <= self.spec.disable_by_batch_size
        if self.proposer is not None:
            self.proposer.observe(input_ids, positions, meta, drafting=drafting)
        load = self._take_expert_load()
        prompt_lps = self._prompt_logprobs(hidden, prompt_rows) if prompt_rows else None
        if not samples:
            return ModelRunnerOutput([], [], expert_load=load, prompt_logprobs=prompt_lps)
        tokens, logprobs = self._tokens(hidden[torch.tensor(sample_idx)], samples)
        reqs = [req for req, _ in samples]
        for req, toks in zip(reqs, tokens):
            self.structured.accept(req.request_id, toks)
            for token in toks:
                req.append(token)
        return ModelRunnerOutput([r.request_id for r in reqs], tokens,
                                 logprobs if any(lp is not None for lp in logprobs) else None,
                                 self._propose(samples, tokens, drafting) if self.proposer is not None else None, load,
                                 prompt_lps)

    def _take_expert_load(self) -> dict[int, list[int]] | None:
        """Tokens each expert of each MoE layer received since the last call (None: no MoE)."""
        if not self.moe_layers:
            return None
        load = {m.layer: m.take_load().tolist() for m in self.moe_layers}
        self.expert_load.add(load)
        return load

    def _inject_fault(self, out: SchedulerOutput) -> None:
        bad = [rid for rid in out.num_scheduled_tokens if self.fault_token in self.requests[rid].prompt_token_ids]
        if bad:
            raise RequestStepError(bad, f"injected fault ({FAULT_TOKEN_ENV}) for {', '.join(bad)}")

    def _prompt_logprobs(self, hidden: torch.Tensor, prompt_rows: list[PromptRows]) -> dict[str, PromptLogprobs]:
        out = {}
        for rows in prompt_rows:
            idx = slice(rows.row, rows.row + len(rows.targets))
            entries = prompt_logprobs(self.model.compute_logits, hidden[idx], torch.tensor(rows.targets), rows.k,
                                      self.sampler.vocab_size)
            out[rows.request_id] = PromptLogprobs(rows.position + 1, entries)
        return out

    def _tokens(self, hidden: torch.Tensor, samples: list[tuple[RunnerRequest, list[int]]]):
        """Tokens (and logprobs) from the sampled rows' hidden states: straight from the LM head's
        argmax when every row is plain greedy without drafts or a grammar, else logits and _sample."""
        reqs = [req for req, drafts in samples if not drafts]
        if len(reqs) == len(samples) and Sampler.argmax_only(reqs) and \
                not any(self.structured.is_constrained(r.request_id) for r in reqs):
            ids = self.model.greedy_tokens(hidden, self.sampler.vocab_size)
            if ids is not None:
                return [[t] for t in ids.tolist()], [None] * len(samples)
        return self._sample(self.model.compute_logits(hidden), samples)

    def _sample(self, logits: torch.Tensor, samples: list[tuple[RunnerRequest, list[int]]]):
        """Plain rows through the sampler, rows with drafts through verification; logits hold each
        request's rows in order (one, or k+1 with k drafts)."""
        tokens: list[list[int]] = [[] for _ in samples]
        logprobs: list = [None] * len(samples)
        offsets = np.cumsum([0] + [len(d) + 1 for _, d in samples])
        plain = [i for i, (_, d) in enumerate(samples) if not d]
        if plain:
            reqs = [samples[i][0] for i in plain]
            out = self.sampler(logits[torch.tensor(offsets[plain])], reqs,
                               self.structured.bitmask([r.request_id for r in reqs]))
            for i, token, lp in zip(plain, out.token_ids, out.logprobs):
                tokens[i], logprobs[i] = [token], [lp] if lp is not None else None
        spec = [i for i, (_, d) in enumerate(samples) if d]
        if spec:
            rows = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in spec])
            v = verify(self.sampler, logits[rows], [samples[i][0] for i in spec], [samples[i][1] for i in spec])
            for i, toks, lp in zip(spec, v.token_ids, v.logprobs):
                tokens[i], logprobs[i] = toks, lp
        return tokens, logprobs

    def _propose(self, samples: list[tuple[RunnerRequest, list[int]]], tokens: list[list[int]],
                 drafting: bool) -> list[list[int]]:
        """Drafts for each request's next step; none while more than disable_by_batch_size requests
        are unfinished (running or waiting: a step is then compute-bound). A request's draft length
        follows its last acceptance (one more than it accepted, at most num_speculative_tokens)."""
        if not drafting:
            return [[] for _ in samples]
        k_max = self.spec.num_speculative_tokens
        reqs = []
        for (req, verified), toks in zip(samples, tokens):
            req.spec_k = min(k_max, len(toks)) if verified else (req.spec_k or k_max)
            # no drafts for a constrained request: the grammar is not in verify()
            k = 0 if self.structured.is_constrained(req.request_id) else req.spec_k
            accepted = len(toks) - 1 if verified else 0
            reqs.append(DraftRequest(req.token_ids, req.block_ids, k, len(verified), accepted))
        return self.proposer.propose(reqs)

    def _update_states(self, out: SchedulerOutput) -> None:
        for rid in out.finished_request_ids:
            self.requests.pop(rid, None)
            self.sampler.forget(rid)
            self.structured.remove(rid)
        for rid in out.preempted_request_ids:  # back as new requests later; a seeded sampler keeps its state
            self.requests.pop(rid, None)
            self.structured.remove(rid)
        for new in out.new_requests:
            self.requests[new.request_id] = RunnerRequest.from_new(new)
            self.structured.add(new.request_id, new.params, new.eos_token_id, new.output_token_ids)
        for cached in out.cached_requests:
            req = self.requests[cached.request_id]
            req.block_ids.extend(cached.new_block_ids)
            req.num_computed_tokens = cached.num_computed_tokens

    def _layout(self, out: SchedulerOutput):
        """Flat batch: each request's tokens from its first uncomputed one (then its drafts, which
        sit at the next positions and slots). A request whose known tokens are all computed
        samples: from its last row, or from all k+1 rows when it has k drafts."""
        bs = self.block_size
        ids, pos, slots, qsl, seq_lens, tables, prompt_lens = [], [], [], [0], [], [], []
        sample_idx, samples, prompt_rows = [], [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            start = req.num_computed_tokens
            drafts = out.spec_token_ids.get(rid, [])
            p = np.arange(start, start + n)
            ids.append(np.asarray(req.token_ids[start:start + n - len(drafts)] + drafts))
            pos.append(p)
            slots.append(np.asarray(req.block_ids)[p // bs] * bs + p % bs)
            k = req.params.prompt_logprobs
            # rows whose next token is a prompt token: positions start .. len(prompt) - 2
            count = min(start + n, len(req.prompt_token_ids) - 1) - start
            if k is not None and count > 0:
                prompt_rows.append(PromptRows(rid, qsl[-1], start, req.token_ids[start + 1:start + count + 1], k))
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            prompt_lens.append(len(req.prompt_token_ids))
            tables.append(req.block_ids)
            if start + n - len(drafts) == len(req.token_ids):
                sample_idx.extend(range(qsl[-1] - len(drafts) - 1, qsl[-1]))
                samples.append((req, drafts))
        layout = BatchLayout(torch.from_numpy(np.concatenate(slots)), qsl, seq_lens, tables, bs, prompt_lens)
        return (torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(pos)),
                layout, sample_idx, samples, prompt_rows)

    # -- scoring --------------------------------------------------------------------------------
    @torch.inference_mode()
    def full_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [n, vocab] at every position of one sequence, using scratch KV blocks from 0.
        For scoring (perplexity, reference tests); call only when no request holds blocks."""
        n = len(token_ids)
        blocks = list(range(-(-n // self.block_size)))
        if len(blocks) > self.num_blocks:
            raise ValueError(f"text of {n} tokens does not fit in the KV cache")
        layout = BatchLayout(torch.arange(n), [0, n], [n], [blocks], self.block_size, [n])
        meta = self.backend.build_metadata(layout)
        hidden = self.model(torch.tensor(token_ids), torch.arange(n), self.kv_caches, self.backend, meta)
        return self.model.compute_logits(hidden)
