"""EngineConfig (what the user asked) -> TokenmillConfig (what runs), in one pass and in one place:
model folder (a GGUF converted on first use), architecture, dtype, context length, KV block count
from the memory budget and the model's own KV spec, threads."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from tokenmill.config import CacheConfig, DeviceConfig, EngineConfig, ModelSpec, TokenmillConfig
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.cpu import available_memory_bytes, core_budget, cpu_has_bf16
from tokenmill.models.identity import model_content_id
from tokenmill.models.model_config import ModelConfig, read_hf_config
from tokenmill.models.registry import get_model_class
from tokenmill.quant import CHECKPOINT_METHODS

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def resolve_config(cfg: EngineConfig) -> TokenmillConfig:
    from tokenmill.spec.resolve import draft_kv_bytes_per_token, resolve_speculative
    model = resolve_model(cfg)
    cfg = replace(cfg, kv_cache_dtype=resolve_kv_cache_dtype(cfg, model))
    budget = core_budget(cfg.num_threads)
    spec = resolve_speculative(cfg.speculative_config, model)
    draft_bytes = draft_kv_bytes_per_token(spec, cfg.kv_cache_dtype, TORCH_DTYPES[model.dtype], cfg.block_size)
    return TokenmillConfig(
        model=model,
        cache=resolve_cache(cfg, model, draft_bytes),
        scheduler=SchedulerConfig(max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
                                  max_model_len=model.max_model_len,
                                  long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                                  one_prompt_end_per_step=cfg.one_prompt_end_per_step,
                                  num_lookahead_tokens=spec.num_speculative_tokens if spec and spec.drafts_with_a_model
                                  else 0),
        device=DeviceConfig(num_threads=budget.threads, adaptive_threads=cfg.num_threads is None,
                            threads_reason=budget.reason, attention_backend=cfg.attention_backend, seed=cfg.seed,
                            batch_invariant=cfg.batch_invariant),
        speculative=spec, kv_role=cfg.kv_role, kv_transfer_timeout_s=cfg.kv_transfer_timeout_s,
        kv_connector=cfg.kv_connector)


def resolve_model_folder(model: str | None) -> Path:
    return resolve_source(model)[0]


def resolve_source(model: str | None) -> tuple[Path, Path | None]:
    """(Hugging Face folder, the .gguf it was converted from or None). A .gguf is converted once
    (cached), so calling this again for the same file is cheap."""
    if model is None:
        from tokenmill.models.default_model import find_default_gguf
        model = str(find_default_gguf())
    path = Path(model)
    if path.suffix == ".gguf":
        from tokenmill.models.gguf_convert import gguf_to_hf_folder
        return gguf_to_hf_folder(path), path
    if not path.is_dir():
        raise ValueError(f"model must be a Hugging Face folder or a .gguf file; got {model!r}")
    return path, None


def resolve_quantization(requested: str | None, gguf_file: Path | None, hf_config: dict | None = None) -> str:
    in_checkpoint = str(((hf_config or {}).get("quantization_config") or {}).get("quant_method", "")).lower() or None
    if in_checkpoint is not None and in_checkpoint not in CHECKPOINT_METHODS:
        raise ValueError(f"config.json quantization_config.quant_method {in_checkpoint!r} is not supported "
                         f"({', '.join(CHECKPOINT_METHODS)} are)")
    if requested is None:
        return in_checkpoint or ("gguf" if gguf_file is not None else "none")
    if in_checkpoint is not None and requested != in_checkpoint:
        raise ValueError(f"quantization={requested!r}: this folder holds a {in_checkpoint} checkpoint; "
                         f"use quantization={in_checkpoint!r} (or leave it unset)")
    if requested in CHECKPOINT_METHODS and in_checkpoint is None:
        raise ValueError(f"quantization={requested!r} needs a folder whose config.json has a {requested} "
                         "quantization_config (see `tokenmill quantize`)")
    if requested == "gguf" and gguf_file is None:
        raise ValueError("quantization='gguf' keeps a .gguf file's quantized blocks: give a .gguf model "
                         "(this model is a Hugging Face folder; use quantization='none')")
    return requested


def read_arch(folder: str | Path) -> ModelConfig:
    return _arch_from_hf(read_hf_config(folder))


def _arch_from_hf(hf: dict) -> ModelConfig:
    return get_model_class((hf.get("architectures") or ["?"])[0]).config_from_hf(hf)


def resolve_model(cfg: EngineConfig) -> ModelSpec:
    folder, gguf_file = resolve_source(cfg.model)
    hf = read_hf_config(folder)
    arch = _arch_from_hf(hf)
    dtype = resolve_dtype(cfg.dtype)
    quantization = resolve_quantization(cfg.quantization, gguf_file, hf)
    name = cfg.served_model_name or (Path(cfg.model).stem if cfg.model else DEFAULT_MODEL_NAME)
    return ModelSpec(path=str(folder), tokenizer=str(cfg.tokenizer or folder), served_name=name, arch=arch,
                     dtype=dtype, max_model_len=resolve_max_model_len(arch, cfg.max_model_len),
                     quantization=quantization, quant_group_size=cfg.quant_group_size,
                     gguf_file=str(gguf_file) if gguf_file else None,
                     content_id=model_content_id(hf, folder, f"{dtype}/{quantization}/{cfg.quant_group_size}"))


def resolve_dtype(name: str) -> str:
    """auto: bfloat16 where our kernels run at an AVX-512 level: with AVX512_BF16 through vdpbf16ps,
    and on AVX-512 without it too, where the GEMMs widen bf16 weights to float32 in registers; half
    the bytes of weights and KV cache still win there (W1 1.28x float32 on machine D, docs/BENCHMARKS.md).
    float32 on AVX2 (bf16 GEMMs slower there) and without our kernels unless the CPU has AVX512_BF16
    (torch's bf16 matmul is emulated, several times slower, elsewhere)."""
    if name != "auto":
        return name
    from tokenmill.kernels import cpu_ops
    level = cpu_ops.isa_level()  # "unavailable" without the kernels
    bf16 = level in ("avx512_bf16", "avx512") or (level == "unavailable" and cpu_has_bf16())
    dtype = "bfloat16" if bf16 else "float32"
    logger.info("dtype auto -> %s (kernels at level %s, CPU %s AVX512_BF16)", dtype, level,
                "with" if cpu_has_bf16() else "without")
    return dtype


def resolve_kv_cache_dtype(cfg: EngineConfig, model: ModelSpec) -> str:
    """auto: the model's dtype, except where `dtype="auto"` chose float32 weights because our kernels run
    AVX2 (no AVX-512): the KV cache is bf16 there, as it is on AVX-512 CPUs, when the model's cache has a
    plain bf16 variant (MLA's has not). Decode attention streams the whole context every step; half the
    bytes make W1 1.07x at the AVX2 cap with perplexity and exact match unchanged (docs/BENCHMARKS.md,
    session 32). An explicit dtype or kv_cache_dtype is kept as given."""
    if cfg.kv_cache_dtype != "auto" or cfg.dtype != "auto" or model.dtype != "float32" \
            or cfg.attention_backend not in ("auto", "cpu"):
        return cfg.kv_cache_dtype
    from tokenmill.kernels import cpu_ops
    if cpu_ops.isa_level() not in ("avx2", "scalar"):  # "unavailable": PyTorch attention, no bf16 reads
        return cfg.kv_cache_dtype
    try:
        get_model_class(model.arch.architecture).kv_cache_spec(model.arch, "bfloat16", torch.float32, cfg.block_size)
    except ValueError:  # this architecture's cache has no plain bf16 form
        return cfg.kv_cache_dtype
    logger.info("kv_cache_dtype auto -> bfloat16 (float32 weights on AVX2: half the KV bytes a decode step reads; "
                "an explicit --dtype float32 keeps a float32 cache)")
    return "bfloat16"


def resolve_max_model_len(arch: ModelConfig, requested: int | None) -> int:
    limit = arch.max_position_embeddings
    if requested is None:
        return limit
    if requested > limit:
        raise ValueError(f"max_model_len={requested} exceeds the model's limit {limit}")
    return requested


def kv_budget_bytes(kv_cache_memory_gb: float | None) -> int:
    if kv_cache_memory_gb is not None:
        return int(kv_cache_memory_gb * (1 << 30))
    return int(min(max(0.1 * available_memory_bytes(), 0.25 * (1 << 30)), 4 * (1 << 30)))


def resolve_cache(cfg: EngineConfig, model: ModelSpec, draft_bytes_per_token: float = 0.0) -> CacheConfig:
    """A draft model's KV (draft_bytes_per_token) shares the budget: it has as many blocks."""
    cls = get_model_class(model.arch.architecture)
    per_token = cls.kv_bytes_per_token(model.arch, cfg.kv_cache_dtype, TORCH_DTYPES[model.dtype], cfg.block_size)
    num_blocks = cfg.num_kv_blocks or int(kv_budget_bytes(cfg.kv_cache_memory_gb)
                                          // ((per_token + draft_bytes_per_token) * cfg.block_size))
    if num_blocks < 1:
        raise ValueError(f"kv_cache_memory_gb={cfg.kv_cache_memory_gb} holds no KV block "
                         f"({per_token * cfg.block_size:.0f} bytes per block)")
    return CacheConfig(block_size=cfg.block_size, num_blocks=num_blocks, kv_cache_dtype=cfg.kv_cache_dtype,
                       enable_prefix_caching=cfg.enable_prefix_caching, bytes_per_token=per_token,
                       block_hash_key=f"{model.content_id}|kv={cfg.kv_cache_dtype}",
                       sliding_window=model.arch.uniform_sliding_window, prefault=cfg.kv_cache_prefault)
