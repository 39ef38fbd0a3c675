"""A model's serving-relevant shape from any Hugging Face config.json (torch-free): parameter bytes,
KV bytes per token and FLOPs per token, for dense (Llama/Qwen/Mistral), MoE (Mixtral, Qwen-MoE,
DeepSeek) and MLA (DeepSeek-V2/V3: a latent KV cache) variants, and OPT's plain MLP (`ffn_dim`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def _require(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg:
        raise ValueError(f"config.json has no {key!r} (needed for the model's shape)")
    return cfg[key]


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (MoE: of the dense layers, if any)
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 0  # 0: dense
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0  # leading dense layers of a MoE model (DeepSeek's first_k_dense_replace)
    kv_lora_rank: int = 0  # >0: MLA, the cache holds a latent of this width plus the rope key
    qk_rope_head_dim: int = 0
    mlp_matrices: int = 3  # gate, up, down (SwiGLU); 2 for a plain MLP (OPT, GPT-2 style: fc1, fc2)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "model") -> ModelShape:
        heads = _require(cfg, "num_attention_heads")
        hidden = _require(cfg, "hidden_size")
        experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
        head_dim = cfg.get("head_dim") or hidden // heads
        if cfg.get("kv_lora_rank"):
            head_dim = cfg.get("qk_nope_head_dim", 128) + cfg.get("qk_rope_head_dim", 64)
        return cls(
            name=name, num_layers=_require(cfg, "num_hidden_layers"), hidden_size=hidden, num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
            intermediate_size=cfg.get("ffn_dim") or _require(cfg, "intermediate_size"),
            vocab_size=_require(cfg, "vocab_size"), mlp_matrices=2 if "ffn_dim" in cfg else 3,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=int(experts),
            experts_per_token=int(cfg.get("num_experts_per_tok") or (2 if experts else 0)),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size", 0) if experts else 0)),
            num_shared_experts=int(cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0)),
            num_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
            kv_lora_rank=int(cfg.get("kv_lora_rank") or 0), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0))

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        path = Path(folder) / "config.json" if Path(folder).is_dir() else Path(folder)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"--model: cannot read a Hugging Face config.json at {path}: {e}") from None
        return cls.from_hf_config(cfg, name=path.parent.name)

    # -- parameters -----------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def _attention_params(self) -> int:
        h, q = self.hidden_size, self.num_heads * self.head_dim
        if self.is_mla:  # q, the latent down/up projections, o (approximate: no q-lora)
            latent = self.kv_lora_rank + self.qk_rope_head_dim
            return h * q + h * latent + self.kv_lora_rank * self.num_heads * 2 * self.head_dim + q * h
        kv = self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h

    def _mlp_params(self, width: int) -> int:
        return self.mlp_matrices * self.hidden_size * width

    def _layer_params(self, active: bool) -> tuple[int, int]:
        """(dense-layer params, MoE-layer params); `active`: only the experts a token uses."""
        attn = self._attention_params()
        dense = attn + self._mlp_params(self.intermediate_size)
        if not self.is_moe:
            return dense, dense
        experts = self.experts_per_token if active else self.num_experts
        moe = attn + (experts + self.num_shared_experts) * self._mlp_params(self.moe_intermediate_size)
        return dense, moe + self.hidden_size * self.num_experts  # + router

    def _params(self, active: bool) -> int:
        dense, moe = self._layer_params(active)
        n_dense = self.num_dense_layers if self.is_moe else self.num_layers
        body = n_dense * dense + (self.num_layers - n_dense) * moe
        lm_head = self.vocab_size * self.hidden_size
        return body + lm_head * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        return self._params(active=False)

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward multiplies by (the embedding lookup is not a GEMM)."""
        embed = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self._params(active=True) - embed

    def weight_bytes(self, weight_dtype: str = "bfloat16") -> float:
        return self.num_params * DTYPE_BYTES[weight_dtype]

    def kv_bytes_per_token(self, kv_dtype: str = "bfloat16") -> float:
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim
        return self.num_layers * per_layer * DTYPE_BYTES[kv_dtype]

    # -- FLOPs ----------------------------------------------------------------------------------
    @property
    def linear_flops_per_token(self) -> float:
        return 2.0 * self.num_active_params

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one (query token, context token) pair over all layers: QK^T and PV."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim
