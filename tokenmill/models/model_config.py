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
class MoESpec:
    """A sparse MoE MLP: how the router scores and picks experts, and the shared experts beside it.

    scoring softmax (Mixtral, Qwen2-MoE, DeepSeek-V2) or sigmoid (DeepSeek-V3, whose choice adds
    `e_score_correction_bias` but whose weights do not); with num_groups, experts come in groups
    and only the topk_group best groups are eligible (group score: the best expert, "max", V2's
    group_limited_greedy, or the sum of the best two, "top2_sum", V3); renormalize divides the
    chosen weights by their sum; every weight is then multiplied by routed_scaling_factor."""
    num_experts: int
    top_k: int
    intermediate_size: int
    sparse_layers: tuple[bool, ...]  # per layer: MoE (True) or a dense MLP
    scoring: str = "softmax"
    renormalize: bool = True
    num_groups: int | None = None
    topk_group: int | None = None
    group_score: str = "max"
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_name: str = "shared_experts"  # checkpoint name of the shared expert(s)
    shared_gate: bool = False  # Qwen2-MoE: sigmoid(Linear(hidden, 1)) scales the shared expert

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE scoring must be softmax or sigmoid, got {self.scoring!r}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.top_k}")
        if self.num_groups and (self.num_experts % self.num_groups or not 1 <= (self.topk_group or 0) <= self.num_groups):
            raise ValueError(f"n_group={self.num_groups} must divide {self.num_experts} experts and topk_group "
                             f"must be in [1, n_group], got {self.topk_group}")


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): keys and values come from a per-token latent
    of kv_lora_rank plus one RoPE key of qk_rope_head_dim shared by all heads."""
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # RoPE over (x0, x1), (x2, x3) ... pairs (DeepSeek's layout)


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
    # per layer "full_attention" | "sliding_attention" (HF's layer_types); None: every layer slides
    # when sliding_window is set
    layer_types: tuple[str, ...] | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of one layer's attention (None: full attention)."""
        if not self.sliding_window:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def uniform_sliding_window(self) -> int | None:
        """The window when every layer slides (then blocks behind it can be freed), else None."""
        windows = {self.layer_window(i) for i in range(self.num_layers)}
        return windows.pop() if len(windows) == 1 else None

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
            sliding_window=cfg.get("sliding_window"),
            layer_types=tuple(cfg["layer_types"]) if cfg.get("layer_types") else None)
        fields.update(overrides)
        types = fields["layer_types"]
        if types is not None and (len(types) != fields["num_layers"]
                                  or not set(types) <= {"full_attention", "sliding_attention"}):
            raise ValueError(f"config.json layer_types must list full_attention or sliding_attention for each of "
                             f"the {fields['num_layers']} layers, got {list(types)}")
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
