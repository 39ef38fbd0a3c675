"""Mixtral: the Mistral architecture whose MLP is a sparse MoE (`block_sparse_moe`): softmax
router, top-k, the chosen weights renormalized to sum to one, no shared expert."""
from __future__ import annotations

from typing import Any

from tokenmill.models.model_config import ModelConfig, MoESpec
from tokenmill.models.moe_causal_lm import MoECausalLM


class MixtralForCausalLM(MoECausalLM):
    moe_name = "block_sparse_moe"
    stacked_params = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
        "self_attn.v_proj": ("self_attn.qkv_proj", 2),
        "w1": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1), "w2": ("down_proj", None),
    }

    @classmethod
    def config_from_hf(cls, hf_config: dict[str, Any]) -> ModelConfig:
        base = ModelConfig.from_hf(hf_config)
        moe = MoESpec(num_experts=hf_config["num_local_experts"], top_k=hf_config["num_experts_per_tok"],
                      intermediate_size=base.intermediate_size, sparse_layers=(True,) * base.num_layers)
        return ModelConfig.from_hf(hf_config, moe=moe)
