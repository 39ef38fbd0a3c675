"""The architecture facts our model code needs, read from a Hugging Face config.json.

`ModelConfig.from_hf` parses the fields every decoder-only family shares; a model class refines it
in its own `config_from_hf` hook (e.g. Qwen2's q/k/v bias), and `load_model_config` asks the
architecture registry which class applies. Torch-free until the registry imports a model class.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
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
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], **overrides: Any) -> ModelConfig:
        """The shared fields of a config.json; a missing required key raises a ValueError naming it."""
        arch = (cfg.get("architectures") or ["?"])[0]
        heads = _require(cfg, "num_attention_heads")
        rope_params = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope_params if rope_params.get("rope_type", "default") != "default"
                                              else None)
        eos = cfg.get("eos_token_id")
        fields: dict[str, Any] = dict(
            architecture=arch, vocab_size=_require(cfg, "vocab_size"), hidden_size=_require(cfg, "hidden_size"),
            intermediate_size=_require(cfg, "intermediate_size"), num_layers=_require(cfg, "num_hidden_layers"),
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or _require(cfg, "hidden_size") // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta") or rope_params.get("rope_theta", 10000.0),
            rope_scaling=scaling, max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", False),
            eos_token_ids=(eos,) if isinstance(eos, int) else tuple(eos or ()),
            sliding_window=cfg.get("sliding_window"))
        fields.update(overrides)
        return cls(**fields)


def _require(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ValueError(f"config.json has no {key!r} (required for {(cfg.get('architectures') or ['?'])[0]})")
    return cfg[key]


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json in model folder {str(folder)!r}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(path)!r} is not valid JSON: {e}") from None


def load_model_config(folder: str | Path) -> ModelConfig:
    from tokenmill.models.registry import get_model_class

    cfg = read_hf_config(folder)
    arch = (cfg.get("architectures") or ["?"])[0]
    return get_model_class(arch).config_from_hf(cfg)
