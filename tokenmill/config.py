"""Engine configuration: every knob in one validated dataclass."""
from __future__ import annotations

import os
from dataclasses import dataclass

from tokenmill.core.scheduler import SchedulerConfig

DTYPES = ("auto", "bfloat16", "float32", "float16")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "reference")


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder or .gguf file; None: the embedded SmolLM2-135M-Instruct
    tokenizer: str | None = None
    dtype: str = "auto"  # auto: bfloat16 on CPUs with AVX-512 bf16, else float32
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_gb: float | None = None  # None: 10% of available memory, within [0.25, 4] GiB
    num_kv_blocks: int | None = None  # overrides the budget (tests, simulations)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 128
    long_prefill_token_threshold: int = 0
    attention_backend: str = "auto"  # auto: our C++ decode kernel (cpu) if it builds here, else torch
    seed: int = 0
    num_threads: int | None = None  # None: all cores of this process
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        _choice("dtype", self.dtype, DTYPES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"block_size must be a power of two in [1, 256], got {self.block_size}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.model is not None and not os.path.exists(self.model):
            raise ValueError(f"model path does not exist: {self.model!r} (give a Hugging Face model folder "
                             "or a .gguf file; no model hub is contacted)")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(max_num_batched_tokens=self.max_num_batched_tokens,
                               max_num_seqs=self.max_num_seqs, max_model_len=max_model_len,
                               long_prefill_token_threshold=self.long_prefill_token_threshold)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
