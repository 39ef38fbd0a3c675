"""The Llama family (Llama, Mistral, Qwen2, Qwen3): GQA, RoPE, RMSNorm, SwiGLU, optional q/k/v bias,
optional per-head q/k RMSNorm (Qwen3), optional sliding window per layer (Mistral, Qwen2/3).
Input is one flat token batch; attention goes through the attention backend. MoE families reuse the
attention and decoder layer with another MLP (`mlp_factory`)."""
from __future__ import annotations

import logging

import torch
from torch import nn

from tokenmill.attention.backend import AttentionBackend
from tokenmill.models.base import CausalLM
from tokenmill.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, VocabEmbedding
from tokenmill.models.linear import Linear
from tokenmill.models.model_config import ModelConfig
from tokenmill.models.native_stack import NativeLayerStack
from tokenmill.quant import QuantConfig

logger = logging.getLogger(__name__)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, quant: QuantConfig, prefix: str,
                 layer: int = 0, qk_norm: bool = False) -> None:
        super().__init__()
        self.sliding_window = cfg.layer_window(layer)
        # Qwen3: RMSNorm over each head's dims of q and k, before RoPE
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], bias=cfg.attention_bias,
                               quant_method=quant.get_linear_method(f"{prefix}.qkv_proj"), prefix=f"{prefix}.qkv_proj")
        self.o_proj = Linear(self.q_size, cfg.hidden_size, quant_method=quant.get_linear_method(f"{prefix}.o_proj"),
                             prefix=f"{prefix}.o_proj")
        self.rope = rope
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x, cos_sin, kv_cache, backend: AttentionBackend, meta) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rope.apply(q, k, cos_sin)
        out = backend.forward(q, k, v, kv_cache, meta, self.scale, self.sliding_window)
        return self.o_proj(out.reshape(-1, self.q_size))


def dense_mlp(cfg: ModelConfig, quant: QuantConfig, prefix: str, layer: int) -> tuple[str, nn.Module]:
    """(checkpoint module name, module) of a layer's MLP."""
    return "mlp", SwiGLU(cfg.hidden_size, cfg.intermediate_size, quant, f"{prefix}.mlp")


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, quant: QuantConfig, prefix: str, layer: int = 0,
                 qk_norm: bool = False, mlp_factory=dense_mlp) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, rope, quant, f"{prefix}.self_attn", layer, qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp_name, mlp = mlp_factory(cfg, quant, prefix, layer)
        setattr(self, self.mlp_name, mlp)  # named as in the checkpoint (mlp, block_sparse_moe)

    def forward(self, x, residual, cos_sin, kv_cache, backend, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it); the next layer (or the
        final norm) adds them, fused with its RMSNorm."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos_sin, kv_cache, backend, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return getattr(self, self.mlp_name)(h), residual


class LlamaForCausalLM(CausalLM):
    qk_norm = False  # Qwen3
    mlp_factory = staticmethod(dense_mlp)
    stacked_params = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
        "self_attn.v_proj": ("self_attn.qkv_proj", 2),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0), "mlp.up_proj": ("mlp.gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, max_positions: int, quant: QuantConfig) -> None:
        super().__init__(cfg)
        rope = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, rope, quant, f"layers.{i}", i, self.qk_norm, self.mlp_factory)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, quant_method=quant.get_linear_method("lm_head"),
                              prefix="lm_head")
        self.tie_weights()

    def tie_weights(self) -> None:
        """Tied embeddings: the LM head reads the embedding matrix (call again after to_empty)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
            self.lm_head.tied = True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list,
                backend: AttentionBackend, meta) -> torch.Tensor:
        """input_ids, positions: [T]. Returns final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        cos_sin = self.layers[0].self_attn.rope.cos_sin(positions, x.dtype)
        stack = self.native_layer_stack()
        native = stack.run(x, cos_sin, kv_caches, backend, meta) if stack is not None else None
        if native is not None:  # all layers in one C++ call
            return self.norm(*native)[0]
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, cos_sin, kv_cache, backend, meta)
        return self.norm(x, residual)[0]

    def native_layer_stack(self) -> NativeLayerStack | None:
        """The C++ layer stack for this model (built at the first forward, after loading), or None."""
        if "_native_stack" not in self.__dict__:
            stack = self.__dict__["_native_stack"] = NativeLayerStack.build(self)
            logger.info("layers: %s", "Python modules (no C++ layer stack for these layers or weights, or "
                        "TOKENMILL_NATIVE_STACK=0)" if stack is None else "one C++ call a step (%s; TOKENMILL_NATIVE_STACK=0 "
                        "runs the Python modules)" % ("pure decode steps only" if stack.decode_only else
                                                      "decodes and prompt chunks"))
        return self.__dict__["_native_stack"]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """compute_logits(hidden)[:, :vocab_size].argmax(-1) where the LM head's weight format can
        take it without writing the logits; else None (also for a subclass whose compute_logits
        does more than the LM head, e.g. a logit cap or scale)."""
        if type(self).compute_logits is not LlamaForCausalLM.compute_logits:
            return None
        return self.lm_head.quant_method.apply_argmax(self.lm_head, hidden, vocab_size)
