"""Qwen2: the Llama architecture with q/k/v biases; its sliding window applies only when enabled
(and then to the layers `layer_types` names)."""
from __future__ import annotations

from typing import Any

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig
from tokenmill.models.qwen3 import sliding_window_if_enabled


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_from_hf(cls, hf_config: dict[str, Any]) -> ModelConfig:
        return ModelConfig.from_hf(hf_config, attention_bias=True, sliding_window=sliding_window_if_enabled(hf_config))
