"""Qwen3: the Llama architecture with RMSNorm over each head of q and k (before RoPE), no q/k/v
bias by default, an explicit head_dim; its sliding window applies only when enabled, and then
only to the layers `layer_types` names (from max_window_layers on)."""
from __future__ import annotations

from typing import Any

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig


def sliding_window_if_enabled(hf_config: dict[str, Any]) -> int | None:
    return hf_config.get("sliding_window") if hf_config.get("use_sliding_window", False) else None


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True

    @classmethod
    def config_from_hf(cls, hf_config: dict[str, Any]) -> ModelConfig:
        return ModelConfig.from_hf(hf_config, sliding_window=sliding_window_if_enabled(hf_config))
