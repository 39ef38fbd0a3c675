"""Qwen2: the Llama architecture with q/k/v biases; its sliding window applies only when enabled."""
from __future__ import annotations

from typing import Any

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: dict[str, Any]) -> ModelConfig:
        sliding = hf_config.get("sliding_window") if hf_config.get("use_sliding_window", False) else None
        return ModelConfig.from_hf(hf_config, attention_bias=True, sliding_window=sliding)
