"""Configuration, resolved once and handed down.

`EngineConfig` is what the user asked for (LLM(...) keywords, `--flags`), checked on construction.
`resolve_config` (tokenmill/engine/resolve.py) turns it into a `TokenmillConfig`: frozen records
with every default filled in (model folder, dtype, context length, KV block count, threads). Each
layer receives only its part: the model runner the model, cache and device records, the scheduler
its SchedulerConfig, the KV manager the cache record. Torch-free: the simulator builds the same
records from a performance profile.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.models.model_config import ModelConfig

DTYPES = ("auto", "bfloat16", "float32", "float16")
KV_CACHE_DTYPES = ("auto", "bfloat16", "int8", "fp8")
QUANTIZATIONS = ("gguf", "none", "int8", "int4", "awq", "gptq", "compressed-tensors")
QUANT_GROUP_SIZES = (32, 64, 128)
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "reference")
KV_ROLES = ("prefill", "decode", "both")
KV_CONNECTORS = ("shm", "nixl")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF folder or .gguf file; None: the embedded SmolLM2-135M-Instruct
    tokenizer: str | None = None
    dtype: str = "auto"  # auto: bfloat16 where our kernels run AVX-512 (with or without AVX512_BF16), else float32
    max_model_len: int | None = None
    block_size: int = 32  # tokens per KV block; scattered K/V reads 1.2x faster than with 16 (docs/BENCHMARKS.md)
    kv_cache_memory_gb: float | None = None  # None: 10% of available memory, within [0.25, 4] GiB
    num_kv_blocks: int | None = None  # overrides the budget (tests, simulations)
    kv_cache_dtype: str = "auto"  # auto: the model dtype; bfloat16 under dtype auto's float32 weights on AVX2
    # map the KV cache's pages at start, so no step pays a first-write page fault (seconds at start;
    # the whole budget is then resident, as in vLLM). `tokenmill serve` turns it on
    kv_cache_prefault: bool = False
    # weight format: gguf (a .gguf's quantized blocks kept), none (float weights in `dtype`), int8
    # (per output channel) / int4 (per group of quant_group_size inputs), weight-only, at load;
    # awq / gptq: a folder quantized by those tools (its config.json says so);
    # None: gguf for a .gguf model (the default model too), the folder's own awq/gptq, else none
    quantization: str | None = None
    quant_group_size: int = 32
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 128
    long_prefill_token_threshold: int = 0
    # a step that ends a prompt takes no other prompt's chunk (decodes still do), so that prompt's first
    # token is not held back by a newcomer's prefill: TTFT for a server (`tokenmill serve` turns it on);
    # offline, packing prompts is the faster order
    one_prompt_end_per_step: bool = False
    attention_backend: str = "auto"  # auto: our C++ kernels (cpu) if they build here, else torch
    # a sequence's logits never depend on what it is batched with (nor on speculative verification):
    # one accumulation order per kernel for every row count; process-wide once set (kernels/csrc/cpu_isa.h)
    batch_invariant: bool = False
    seed: int = 0
    num_threads: int | None = None  # None: the cores this process may use
    served_model_name: str | None = None
    speculative_config: dict | None = None  # vLLM's fields: {"method": "ngram", "num_speculative_tokens": 4, ...}
    # prefill/decode disaggregation: prefill (KV cache in shared memory, sends), decode (receives), both (neither)
    kv_role: str = "both"
    kv_transfer_timeout_s: float = 30.0  # a prefill engine frees unclaimed sent blocks after this
    kv_connector: str = "shm"  # shm (one machine) | nixl (NIXL over UCX; the tokenmill[nixl] extra)

    def __post_init__(self) -> None:
        _choice("dtype", self.dtype, DTYPES)
        _choice("kv_role", self.kv_role, KV_ROLES)
        _choice("kv_connector", self.kv_connector, KV_CONNECTORS)
        if not (isinstance(self.kv_transfer_timeout_s, (int, float)) and self.kv_transfer_timeout_s >= 0):
            raise ValueError(f"kv_transfer_timeout_s must be a number >= 0, got {self.kv_transfer_timeout_s!r}")
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.quantization is not None:
            _choice("quantization", self.quantization, QUANTIZATIONS)
        if self.quant_group_size not in QUANT_GROUP_SIZES:
            raise ValueError(f"quant_group_size must be one of 32, 64, 128; got {self.quant_group_size!r}")
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be a power of two in [1, 256], got {self.block_size}")
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        for name in ("max_model_len", "num_kv_blocks", "num_threads", "max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {self.long_prefill_token_threshold}")
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)  # validates, names the bad field
        if self.model is not None and not os.path.exists(self.model):
            raise ValueError(f"model path does not exist: {self.model!r} (give a Hugging Face model folder "
                             "or a .gguf file; no model hub is contacted)")


@dataclass(frozen=True)
class ModelSpec:
    path: str  # Hugging Face-style folder (a GGUF file is converted into one)
    tokenizer: str
    served_name: str
    arch: ModelConfig
    dtype: str  # resolved: float32 | bfloat16 | float16
    max_model_len: int
    quantization: str  # resolved: gguf | none | int8 | int4 | awq | gptq
    quant_group_size: int
    gguf_file: str | None  # the .gguf the folder was converted from (quantization gguf reads it)
    # architecture, config, dtype and a fingerprint of the weights, never a path: two engines on
    # different machines with the same model agree on it (and so on prefix-cache block hashes)
    content_id: str


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    num_blocks: int
    kv_cache_dtype: str
    enable_prefix_caching: bool
    bytes_per_token: float  # all layers, K and V, scales included
    block_hash_key: str  # the extra key of every block hash: model content id + KV storage
    # every layer attends only to its last sliding_window tokens: blocks behind it are freed early
    sliding_window: int | None = None
    prefault: bool = False  # map the cache's pages at allocation (host_memory.prefault)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class DeviceConfig:
    num_threads: int  # the most the model uses; fewer while other processes keep the cores busy
    adaptive_threads: bool  # False when the user fixed the count (--num-threads)
    threads_reason: str  # for the startup log
    attention_backend: str
    seed: int
    batch_invariant: bool = False


SPEC_METHODS = ("ngram", "layer_skip", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's field names where the concept is the same).

    - `ngram` (prompt lookup): the tokens that followed the latest earlier occurrence of the
      request's last n tokens, n from prompt_lookup_max down to prompt_lookup_min.
    - `layer_skip` (self-speculative): the target's own first `num_draft_layers` layers, its final
      norm and LM head draft greedily (None: resolved per model, docs/BENCHMARKS.md).
    - `draft_model`: `model` (an HF folder or .gguf with the target's tokenizer) drafts greedily;
      `quantization` is the draft's weight format (as the engine's: None = the file's own, so a
      .gguf draft keeps its quantized blocks while the target runs in float).

    Speculation pauses while more than `disable_by_batch_size` requests are unfinished (running or
    waiting: the step is compute-bound there, and verifying drafts costs more than it saves); a
    draft model then skips mirroring the target's steps too."""
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    disable_by_batch_size: int = 16  # measured crossover on a 2-core CPU: docs/BENCHMARKS.md
    num_draft_layers: int | None = None  # layer_skip only
    model: str | None = None  # draft_model only
    quantization: str | None = None  # draft_model only: the draft's weight format

    def __post_init__(self) -> None:
        _choice("speculative_config.method", self.method, SPEC_METHODS)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
            _positive_int(name, getattr(self, name))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")
        if self.num_draft_layers is not None:
            if self.method != "layer_skip":
                raise ValueError(f"speculative_config.num_draft_layers applies to method layer_skip only, not "
                                 f"{self.method!r}")
            _positive_int("num_draft_layers", self.num_draft_layers)
        if (self.model is not None) != (self.method == "draft_model"):
            raise ValueError("speculative_config.model (a Hugging Face folder or .gguf file) is required for method "
                             f"draft_model and allowed only there; method {self.method!r}, model {self.model!r}")
        if self.quantization is not None:
            if self.method != "draft_model":
                raise ValueError(f"speculative_config.quantization applies to method draft_model only, not "
                                 f"{self.method!r}")
            _choice("speculative_config.quantization", self.quantization, QUANTIZATIONS)
        if self.model is not None and not os.path.exists(self.model):
            raise ValueError(f"speculative_config.model path does not exist: {self.model!r}")
        if self.quantization is not None:
            if self.method != "draft_model":
                raise ValueError(f"speculative_config.quantization applies to method draft_model only, not "
                                 f"{self.method!r}")
            _choice("speculative_config.quantization", self.quantization, QUANTIZATIONS)

    @property
    def drafts_with_a_model(self) -> bool:
        """The draft runs a forward pass that writes KV at the draft positions (layer_skip,
        draft_model): those slots must be reserved ahead (lookahead)."""
        return self.method in ("layer_skip", "draft_model")

    @classmethod
    def from_dict(cls, d: dict) -> SpeculativeConfig:
        if not isinstance(d, dict):
            raise ValueError(f"speculative_config must be a dict (JSON object), got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown fields {unknown}; allowed: {', '.join(sorted(known))}")
        return cls(**d)


@dataclass(frozen=True)
class TokenmillConfig:
    model: ModelSpec
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: DeviceConfig
    speculative: SpeculativeConfig | None = None
    kv_role: str = "both"
    kv_transfer_timeout_s: float = 30.0
    kv_connector: str = "shm"


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
