"""MoECausalLM: a Llama-family model whose layers' MLPs are sparse MoE where `moe.sparse_layers`
says so (Mixtral, Qwen2/3-MoE; DeepSeek builds its own layers on it). With expert parallelism,
the checkpoint's experts held by other processes are skipped at load."""
from __future__ import annotations

import re

from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig
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
