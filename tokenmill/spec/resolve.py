"""speculative_config as asked -> as run: checked against the target model (layer count, the
draft model's tokenizer), defaults filled, the draft model's folder resolved (a GGUF converted)."""
from __future__ import annotations

import dataclasses

import torch

from tokenmill.config import ModelSpec, SpeculativeConfig
from tokenmill.engine.resolve import read_arch, resolve_model_folder, resolve_quantization, resolve_source
from tokenmill.models.model_config import read_hf_config
from tokenmill.models.registry import get_model_class
from tokenmill.spec.draft_model import check_same_tokenizer
from tokenmill.spec.layer_skip import default_num_draft_layers


def resolve_speculative(d: dict | None, model: ModelSpec) -> SpeculativeConfig | None:
    if not d:
        return None
    spec = SpeculativeConfig.from_dict(d)
    if spec.method == "layer_skip":
        n = model.arch.num_layers
        layers = spec.num_draft_layers or default_num_draft_layers(n)
        if layers >= n:
            raise ValueError(f"speculative_config.num_draft_layers must be < the model's {n} layers, got {layers}")
        return dataclasses.replace(spec, num_draft_layers=layers)
    if spec.method == "draft_model":
        folder, gguf_file = resolve_source(spec.model)
        check_same_tokenizer(model.arch, model.tokenizer, read_arch(folder), str(folder))
        try:
            quantization = resolve_quantization(spec.quantization, gguf_file, read_hf_config(folder))
        except ValueError as e:
            raise ValueError(f"speculative_config (the draft model): {e}") from None
        return dataclasses.replace(spec, quantization=quantization)  # model stays as given: a .gguf's blocks
    return spec


def draft_kv_bytes_per_token(spec: SpeculativeConfig | None, kv_cache_dtype: str, dtype: torch.dtype,
                             block_size: int) -> float:
    """KV bytes per token the draft model keeps beside the target's (0 without one)."""
    if spec is None or spec.method != "draft_model":
        return 0.0
    arch = read_arch(resolve_model_folder(spec.model))
    return get_model_class(arch.architecture).kv_bytes_per_token(arch, kv_cache_dtype, dtype, block_size)
