"""Qwen2-MoE: Qwen2 attention (q/k/v bias) with a sparse MoE MLP: softmax router, top-k, weights
renormalized only with norm_topk_prob, plus one shared expert whose output is scaled by
sigmoid(shared_expert_gate(x)). Layers in mlp_only_layers, or off the decoder_sparse_step, are
dense."""
from __future__ import annotations

from typing import Any

from tokenmill.models.moe_causal_lm import MoECausalLM
from tokenmill.models.model_config import ModelConfig, MoESpec
from tokenmill.models.qwen3 import sliding_window_if_enabled


class Qwen2MoeForCausalLM(MoECausalLM):
    moe_name = "mlp"
    stacked_params = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
        "self_attn.v_proj": ("self_attn.qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        layers = hf["num_hidden_layers"]
        step, dense = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or ())
        experts = hf.get("num_experts") or hf.get("num_local_experts") or 0  # transformers 5 writes the latter
        sparse = tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(layers))
        moe = MoESpec(num_experts=experts, top_k=hf["num_experts_per_tok"], intermediate_size=hf["moe_intermediate_size"],
                      sparse_layers=sparse, renormalize=hf.get("norm_topk_prob", False),
                      shared_intermediate_size=hf.get("shared_expert_intermediate_size", 0), shared_name="shared_expert",
                      shared_gate=bool(hf.get("shared_expert_intermediate_size", 0)))
        return ModelConfig.from_hf(hf, attention_bias=hf.get("qkv_bias", True),
                                   sliding_window=sliding_window_if_enabled(hf), moe=moe)


class Qwen3MoeForCausalLM(Qwen2MoeForCausalLM):
    """Qwen3-MoE: Qwen3 attention (per-head q/k RMSNorm, no bias) and the Qwen2-MoE sparse MLP
    without a shared expert."""
    qk_norm = True

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        cfg = super().config_from_hf({**hf, "qkv_bias": hf.get("attention_bias", False),
                                      "shared_expert_intermediate_size": 0})
        return cfg
