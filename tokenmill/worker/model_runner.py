"""ModelRunner: turns a SchedulerOutput into one flat batch, runs the model, samples."""
from __future__ import annotations

import logging
import os

import numpy as np
import torch

from tokenmill.attention import BatchLayout, get_attention_backend
from tokenmill.attention.kv_cache import KVCacheSpec, make_kv_cache_spec
from tokenmill.core.scheduler import SchedulerOutput
from tokenmill.models.loader import build_model
from tokenmill.models.model_config import ModelConfig
from tokenmill.request import Request
from tokenmill.worker.sampler import Sampler, SamplerOutput

logger = logging.getLogger(__name__)

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str, model_cfg: ModelConfig) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read()
    except OSError:
        return False


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def kv_budget_bytes(kv_cache_memory_gb: float | None) -> int:
    if kv_cache_memory_gb is not None:
        return int(kv_cache_memory_gb * (1 << 30))
    return int(min(max(0.1 * available_memory_bytes(), 0.25 * (1 << 30)), 4 * (1 << 30)))


class ModelRunner:
    def __init__(self, model_cfg: ModelConfig, folder: str, dtype: torch.dtype, max_model_len: int,
                 block_size: int, kv_cache_memory_gb: float | None, attention_backend: str,
                 num_kv_blocks: int | None = None, kv_cache_dtype: str = "auto") -> None:
        self.model_cfg = model_cfg
        self.dtype = dtype
        self.block_size = block_size
        self.kv_cache_dtype = kv_cache_dtype
        self.model = build_model(model_cfg, folder, dtype, max_model_len)
        self.backend = get_attention_backend(attention_backend)
        spec = kv_cache_spec(model_cfg, kv_cache_dtype, dtype, block_size)
        bytes_per_block = spec.bytes_per_block * model_cfg.num_layers  # all layers, scales included
        self.num_blocks = num_kv_blocks or num_kv_blocks_for_budget(model_cfg, kv_cache_dtype, dtype, block_size,
                                                                    kv_budget_bytes(kv_cache_memory_gb))
        if self.num_blocks < 1:
            raise ValueError(f"kv_cache_memory_gb={kv_cache_memory_gb} holds no block "
                             f"({bytes_per_block:.0f} bytes per block)")
        self.kv_bytes_per_token = bytes_per_block / block_size
        self.kv_spec = spec.with_num_blocks(self.num_blocks)
        self.kv_caches = [self.kv_spec.allocate() for _ in range(model_cfg.num_layers)]
        self.sampler = Sampler(model_cfg.vocab_size)
        logger.info("KV cache (%s): %d blocks x %d tokens, %.0f bytes/token (%.2f GiB)", kv_cache_dtype,
                    self.num_blocks, block_size, self.kv_bytes_per_token,
                    self.num_blocks * bytes_per_block / (1 << 30))

    def _layout(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, BatchLayout, list[int], list[Request]]:
        bs = self.block_size
        ids, pos, slots, qsl, seq_lens, tables = [], [], [], [0], [], []
        sample_idx, sample_reqs = [], []
        for req, n in out.scheduled:
            start = req.num_computed_tokens
            block_ids = out.block_ids[req.request_id]
            p = np.arange(start, start + n)
            ids.append(np.asarray(req.all_token_ids[start:start + n]))
            pos.append(p)
            slots.append(np.asarray(block_ids)[p // bs] * bs + p % bs)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            tables.append(block_ids)
            if start + n == req.num_tokens:  # all known tokens computed: sample the next one
                sample_idx.append(qsl[-1] - 1)
                sample_reqs.append(req)
        layout = BatchLayout(torch.from_numpy(np.concatenate(slots)), qsl, seq_lens, tables, bs)
        return (torch.from_numpy(np.concatenate(ids)), torch.from_numpy(np.concatenate(pos)),
                layout, sample_idx, sample_reqs)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[Request], SamplerOutput | None]:
        input_ids, positions, layout, sample_idx, sample_reqs = self._layout(out)
        meta = self.backend.build_metadata(layout)
        hidden = self.model(input_ids, positions, self.kv_caches, self.backend, meta)
        if not sample_reqs:
            return [], None
        logits = self.model.compute_logits(hidden[torch.tensor(sample_idx)])
        return sample_reqs, self.sampler(logits, sample_reqs)

    @torch.inference_mode()
    def full_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits [n, vocab] at every position of one sequence, using scratch KV blocks from 0.
        For scoring (perplexity, reference tests); call only when no request holds blocks."""
        n = len(token_ids)
        blocks = list(range(-(-n // self.block_size)))
        if len(blocks) > self.num_blocks:
            raise ValueError(f"text of {n} tokens does not fit in the KV cache")
        layout = BatchLayout(torch.arange(n), [0, n], [n], [blocks], self.block_size)
        meta = self.backend.build_metadata(layout)
        hidden = self.model(torch.tensor(token_ids), torch.arange(n), self.kv_caches, self.backend, meta)
        return self.model.compute_logits(hidden)

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """log p(token[i+1] | token[:i+1]) for each position: the basis of perplexity."""
        logp = torch.log_softmax(self.full_logits(token_ids)[:-1], dim=-1)
        return logp.gather(1, torch.tensor(token_ids[1:])[:, None]).squeeze(1)


def kv_cache_spec(model_cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int,
                  num_blocks: int = 1) -> KVCacheSpec:
    """Per-layer KV storage for `kv_cache_dtype` (auto: the model dtype; int8/fp8: quantized)."""
    return make_kv_cache_spec(kv_cache_dtype, dtype, block_size, model_cfg.num_kv_heads, model_cfg.head_dim,
                              num_blocks)


def num_kv_blocks_for_budget(model_cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int,
                             budget_bytes: int) -> int:
    """How many blocks a KV budget holds (what the runner allocates; scales count against it)."""
    spec = kv_cache_spec(model_cfg, kv_cache_dtype, dtype, block_size)
    return int(budget_bytes // (spec.bytes_per_block * model_cfg.num_layers))


def set_num_threads(n: int | None) -> None:
    n = n or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
