"""The one list of architectures: Hugging Face `architectures[0]` -> our model class.

Adding an architecture = its own file (a `CausalLM` subclass with its hooks) + one line here.
Classes are imported on first use; `register_model` adds one at run time (plugins, tests)."""
from __future__ import annotations

import importlib

_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "tokenmill.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "tokenmill.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "tokenmill.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "tokenmill.models.qwen3:Qwen3ForCausalLM",
    "MixtralForCausalLM": "tokenmill.models.mixtral:MixtralForCausalLM",
    "Qwen2MoeForCausalLM": "tokenmill.models.qwen2_moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "tokenmill.models.qwen2_moe:Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM": "tokenmill.models.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "tokenmill.models.deepseek:DeepseekV3ForCausalLM",
}
_registered: dict[str, type] = {}


def register_model(architecture: str, model_class: type) -> None:
    _registered[architecture] = model_class


def supported_architectures() -> list[str]:
    return sorted({*_ARCHITECTURES, *_registered})


def get_model_class(architecture: str) -> type:
    if architecture in _registered:
        return _registered[architecture]
    target = _ARCHITECTURES.get(architecture)
    if target is None:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: "
                         f"{', '.join(supported_architectures())}")
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
