"""The architecture facts our model code needs, read from a Hugging Face config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: list[int]
    bos_token_id: int | None
    sliding_window: int | None
    torch_dtype: str | None

    def kv_bytes_per_token(self, elem_bytes: float) -> float:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * elem_bytes


def load_model_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json in model folder {str(folder)!r}")
    cfg = json.loads(path.read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    heads = cfg["num_attention_heads"]
    rope_params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or (rope_params if rope_params.get("rope_type", "default") != "default"
                                          else None)
    eos = cfg.get("eos_token_id")
    sliding = cfg.get("sliding_window")
    if arch == "Qwen2ForCausalLM" and not cfg.get("use_sliding_window", False):
        sliding = None
    return ModelConfig(
        architecture=arch, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta") or rope_params.get("rope_theta", 10000.0),
        rope_scaling=scaling, max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False),
        eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
        bos_token_id=cfg.get("bos_token_id"), sliding_window=sliding, torch_dtype=cfg.get("torch_dtype"))
