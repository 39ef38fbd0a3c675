"""DeepSeek-V2 / V3: multi-head latent attention (MLA, tokenmill/attention/mla.py) and DeepSeek MoE
(shared experts beside routed ones, group-limited top-k; V3 scores with a sigmoid and steers the
choice with e_score_correction_bias), the first `first_k_dense_replace` layers dense.

The KV cache stores the latent + shared RoPE key per token (`kv_cache_spec`). V2 applies RoPE to
interleaved pairs (its complex-number form), V3 too when rope_interleave; we de-interleave those
dims before a rotate-half RoPE, the same dot products. RoPE default or YaRN (DeepSeek's
long-context checkpoints; its mscale_all_dim also scales the softmax)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tokenmill.attention.backend import AttentionBackend
from tokenmill.attention.mla import (DecompressedKVCacheSpec, MLAKVCacheSpec, MLAMetadata, absorbed_decode,
                                     decompressed_prefill)
from tokenmill.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, VocabEmbedding, yarn_mscale
from tokenmill.models.linear import Linear
from tokenmill.models.moe_causal_lm import MoECausalLM
from tokenmill.models.model_config import MLASpec, ModelConfig, MoESpec
from tokenmill.models.moe import SparseMoE
from tokenmill.quant import QuantConfig
from tokenmill.quant.unquantized import PlainLinearMethod


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, quant: QuantConfig, prefix: str,
                 decompressed_cache: bool = False) -> None:
        super().__init__()
        m: MLASpec = cfg.mla
        self.m, self.num_heads = m, cfg.num_heads
        self.qk_head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        self.decompressed_cache = decompressed_cache

        def linear(name, n_in, n_out, method=None):
            return Linear(n_in, n_out, quant_method=method or quant.get_linear_method(f"{prefix}.{name}"),
                          prefix=f"{prefix}.{name}")

        q_out = cfg.num_heads * self.qk_head_dim
        if m.q_lora_rank is None:
            self.q_proj = linear("q_proj", cfg.hidden_size, q_out)
        else:
            self.q_a_proj = linear("q_a_proj", cfg.hidden_size, m.q_lora_rank)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, 1e-6)
            self.q_b_proj = linear("q_b_proj", m.q_lora_rank, q_out)
        self.kv_a_proj_with_mqa = linear("kv_a_proj_with_mqa", cfg.hidden_size, m.kv_lora_rank + m.qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, 1e-6)
        # plain weight: its halves W_UK / W_UV are also used unpacked by the absorbed decode
        self.kv_b_proj = linear("kv_b_proj", m.kv_lora_rank, cfg.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
                                PlainLinearMethod())
        self.o_proj = linear("o_proj", cfg.num_heads * m.v_head_dim, cfg.hidden_size)
        self.rope = rope
        self.scale = self.qk_head_dim ** -0.5
        scaling = cfg.rope_scaling or {}
        if scaling.get("rope_type", scaling.get("type")) == "yarn" and scaling.get("mscale_all_dim"):
            self.scale *= yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2  # DeepSeek's softmax scale

    def _w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.m
        w = self.kv_b_proj.weight.view(self.num_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
        return w[:, :m.qk_nope_head_dim], w[:, m.qk_nope_head_dim:]  # [H, dn, L], [H, dv, L]

    def _rope(self, q_pe: torch.Tensor, k_pe: torch.Tensor, cos_sin) -> tuple[torch.Tensor, torch.Tensor]:
        if self.m.rope_interleave:  # (x0, x1), (x2, x3) ... pairs -> halves
            q_pe = torch.cat([q_pe[..., 0::2], q_pe[..., 1::2]], dim=-1)
            k_pe = torch.cat([k_pe[..., 0::2], k_pe[..., 1::2]], dim=-1)
        return self.rope.apply(q_pe.contiguous(), k_pe.contiguous(), cos_sin)

    def forward(self, x, cos_sin, kv_cache, backend: AttentionBackend, meta: MLAMetadata) -> torch.Tensor:
        m, h = self.m, self.num_heads
        q = self.q_proj(x) if m.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(-1, h, self.qk_head_dim)
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent.contiguous())
        q_pe, k_pe = self._rope(q_pe, k_pe.view(-1, 1, m.qk_rope_head_dim), cos_sin)
        if self.decompressed_cache:
            out = self._attend_decompressed(q_nope, q_pe, latent, k_pe, kv_cache, meta)
        else:
            out = self._attend_latent(q_nope, q_pe, latent, k_pe, kv_cache[0], meta)
        return self.o_proj(out.reshape(-1, h * m.v_head_dim))

    def _decompress(self, latent: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latent [n, L], k_pe [n, 1, R] -> K [n, H, dn + R], V [n, H, dv]."""
        m = self.m
        kv = self.kv_b_proj(latent.to(self.kv_b_proj.weight.dtype)).view(-1, self.num_heads,
                                                                        m.qk_nope_head_dim + m.v_head_dim)
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1).to(k_nope.dtype)], dim=-1)
        return k, v

    def _attend_latent(self, q_nope, q_pe, latent, k_pe, cache: torch.Tensor, meta: MLAMetadata) -> torch.Tensor:
        m = self.m
        cache.index_copy_(0, meta.slot_mapping, torch.cat([latent, k_pe[:, 0]], dim=-1)[:, None].to(cache.dtype))
        out = q_nope.new_empty(q_nope.shape[0], self.num_heads, m.v_head_dim)
        if meta.decode_rows is not None:
            w_uk, w_uv = self._w_uk_uv()
            rows = meta.decode_rows
            q_lat = torch.einsum("bhd,hdl->bhl", q_nope[rows], w_uk.to(q_nope.dtype))
            o_lat = absorbed_decode(q_lat, q_pe[rows], cache, meta, self.scale)
            out[rows] = torch.einsum("bhl,hvl->bhv", o_lat, w_uv.to(o_lat.dtype))
        for p in meta.prefills:
            ctx = cache[p.slots, 0].to(q_nope.dtype)  # the sequence's latents + rope keys so far
            k, v = self._decompress(ctx[:, :m.kv_lora_rank], ctx[:, None, m.kv_lora_rank:])
            q = torch.cat([q_nope[p.start:p.end], q_pe[p.start:p.end]], dim=-1)
            out[p.start:p.end] = decompressed_prefill(q, k.to(q.dtype), v.to(q.dtype), p.context, self.scale)
        return out

    def _attend_decompressed(self, q_nope, q_pe, latent, k_pe, kv_cache, meta: MLAMetadata) -> torch.Tensor:
        """The baseline: per-head K/V cached; every sequence attends over its gathered K/V."""
        k_new, v_new = self._decompress(latent, k_pe)
        kc, vc = kv_cache
        kc.index_copy_(0, meta.slot_mapping, k_new.to(kc.dtype))
        vc.index_copy_(0, meta.slot_mapping, v_new.to(vc.dtype))
        q = torch.cat([q_nope, q_pe], dim=-1)
        out = q.new_empty(q.shape[0], self.num_heads, self.m.v_head_dim)
        if meta.decode_rows is not None:
            bs = meta.block_size
            k = kc.view(-1, bs, *kc.shape[1:])[meta.block_table].flatten(1, 2).to(q.dtype)  # [Bd, L, H, Dk]
            v = vc.view(-1, bs, *vc.shape[1:])[meta.block_table].flatten(1, 2).to(q.dtype)
            mask = torch.arange(k.shape[1])[None, :] < meta.seq_lens[:, None]
            o = torch.nn.functional.scaled_dot_product_attention(
                q[meta.decode_rows][:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None],
                scale=self.scale)
            out[meta.decode_rows] = o[:, :, 0]
        for p in meta.prefills:
            out[p.start:p.end] = decompressed_prefill(q[p.start:p.end], kc[p.slots].to(q.dtype),
                                                      vc[p.slots].to(q.dtype), p.context, self.scale)
        return out


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, quant: QuantConfig, prefix: str, layer: int,
                 decompressed_cache: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MLAAttention(cfg, rope, quant, f"{prefix}.self_attn", decompressed_cache)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.moe.sparse_layers[layer]:
            self.mlp = SparseMoE(cfg.hidden_size, cfg.moe, quant, f"{prefix}.mlp")
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, quant, f"{prefix}.mlp")

    def forward(self, x, residual, cos_sin, kv_cache, backend, meta):
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos_sin, kv_cache, backend, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DeepseekV2ForCausalLM(MoECausalLM):
    decompressed_cache = False  # True: the benchmark's baseline (per-head K/V cached)
    stacked_params = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, cfg: ModelConfig, max_positions: int, quant: QuantConfig) -> None:
        nn.Module.__init__(self)
        self.config = cfg
        rope = RotaryEmbedding(cfg.mla.qk_rope_head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(cfg, rope, quant, f"layers.{i}", i, self.decompressed_cache)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, quant_method=quant.get_linear_method("lm_head"),
                              prefix="lm_head")
        self.tie_weights()

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return ModelConfig.from_hf(hf, num_kv_heads=hf["num_attention_heads"], head_dim=hf["qk_rope_head_dim"],
                                   moe=cls._moe_spec(hf), mla=cls._mla_spec(hf))

    @classmethod
    def _mla_spec(cls, hf: dict[str, Any]) -> MLASpec:
        return MLASpec(kv_lora_rank=hf["kv_lora_rank"], q_lora_rank=hf.get("q_lora_rank"),
                       qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
                       v_head_dim=hf["v_head_dim"], rope_interleave=hf.get("rope_interleave", True))

    @classmethod
    def _moe_spec(cls, hf: dict[str, Any]) -> MoESpec:
        """V2: softmax scores; topk_method greedy or group_limited_greedy (best expert per group);
        the weights are not renormalized (as transformers' DeepseekV2 router), then scaled."""
        method = hf.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"config.json topk_method must be greedy or group_limited_greedy, got {method!r}")
        grouped = method == "group_limited_greedy"
        return MoESpec(**_shared_moe_fields(hf), scoring="softmax", renormalize=False,
                       num_groups=hf.get("n_group") if grouped else None,
                       topk_group=hf.get("topk_group") if grouped else None, group_score="max")

    @classmethod
    def kv_cache_spec(cls, cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int):
        if kv_cache_dtype != "auto":
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported for MLA models "
                             f"({cfg.architecture}); allowed: auto")
        m = cfg.mla
        if cls.decompressed_cache:
            return DecompressedKVCacheSpec(1, block_size, cfg.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim,
                                           m.v_head_dim, dtype)
        return MLAKVCacheSpec(1, block_size, m.kv_lora_rank + m.qk_rope_head_dim, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list,
                backend: AttentionBackend, meta) -> torch.Tensor:
        mla_meta = MLAMetadata.build(meta.layout, use_kernel=backend.name == "cpu")
        x = self.embed_tokens(input_ids)
        cos_sin = self.layers[0].self_attn.rope.cos_sin(positions, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, cos_sin, kv_cache, backend, mla_meta)
        return self.norm(x, residual)[0]


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    @classmethod
    def _moe_spec(cls, hf: dict[str, Any]) -> MoESpec:
        """V3 (noaux_tc): sigmoid scores; the choice adds e_score_correction_bias and is limited to
        the topk_group groups with the best sum of their two best experts; the weights (bias-free
        scores) are renormalized with norm_topk_prob, then scaled."""
        return MoESpec(**_shared_moe_fields(hf), scoring="sigmoid", renormalize=hf.get("norm_topk_prob", True),
                       num_groups=hf.get("n_group") or 1, topk_group=hf.get("topk_group") or 1,
                       group_score="top2_sum", correction_bias=True)


def _shared_moe_fields(hf: dict[str, Any]) -> dict[str, Any]:
    layers = hf["num_hidden_layers"]
    first_dense = hf.get("first_k_dense_replace", 0)
    step = hf.get("moe_layer_freq", 1)
    return dict(num_experts=hf["n_routed_experts"], top_k=hf["num_experts_per_tok"],
                intermediate_size=hf["moe_intermediate_size"],
                sparse_layers=tuple(i >= first_dense and i % step == 0 for i in range(layers)),
                routed_scaling_factor=hf.get("routed_scaling_factor", 1.0),
                shared_intermediate_size=hf["moe_intermediate_size"] * (hf.get("n_shared_experts") or 0),
                shared_name="shared_experts")
