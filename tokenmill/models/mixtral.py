"""Mixtral: the Mistral architecture whose MLP is a sparse MoE (`block_sparse_moe`): softmax
router, top-k, the chosen weights renormalized to sum to one, no shared expert."""
from __future__ import annotations

import re
from typing import Any

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig, MoESpec
from tokenmill.models.moe import SparseMoE
from tokenmill.quant import QuantConfig

_EXPERT = re.compile(r"\.experts\.(\d+)\.")


class MoECausalLM(LlamaForCausalLM):
    """A Llama-family model whose layers' MLPs are sparse MoE where `moe.sparse_layers` says so."""
    moe_name = "mlp"  # the checkpoint's name of a layer's MLP / MoE block

    @classmethod
    def mlp_factory(cls, cfg: ModelConfig, quant: QuantConfig, prefix: str, layer: int):
        if cfg.moe.sparse_layers[layer]:
            return cls.moe_name, SparseMoE(cfg.hidden_size, cfg.moe, quant, f"{prefix}.{cls.moe_name}")
        return LlamaForCausalLM.mlp_factory(cfg, quant, prefix, layer)

    def skip_weight(self, ckpt_name: str) -> bool:
        """With expert parallelism, other processes' experts are not ours to load."""
        m = _EXPERT.search(ckpt_name)
        if m and ".shared_expert" not in ckpt_name:
            from tokenmill.models.expert_parallel import local_experts
            if int(m.group(1)) not in local_experts(self.config.moe.num_experts):
                return True
        return super().skip_weight(ckpt_name)


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
