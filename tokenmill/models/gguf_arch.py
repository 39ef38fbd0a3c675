"""A GGUF file's metadata -> the Hugging Face config.json of the same model, per GGUF architecture.

Key names and their meaning follow llama.cpp (gguf-py's `Keys`, convert_hf_to_gguf.py): `llama`
(Llama, Mistral; with `expert_count` it is Mixtral), `qwen2`, `qwen3`, `qwen3moe`, `qwen2moe`
(one shared expert with a sigmoid gate) and `deepseek2` (DeepSeek-V2/V3: MLA, shared experts,
leading dense layers; `expert_gating_func` sigmoid is V3's router with `exp_probs_b`)."""
from __future__ import annotations

from typing import Any

import numpy as np

# GGUF architecture -> the HF architecture it converts to (llama with experts: Mixtral)
SUPPORTED_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
                                "qwen2moe": "Qwen2MoeForCausalLM", "deepseek2": "DeepseekV2ForCausalLM"}
_MODEL_TYPES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "deepseek2": "deepseek_v2"}
_GATING_SOFTMAX, _GATING_SIGMOID = 1, 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE values


def check_architecture(arch: Any, where: str) -> str:
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {where}; "
                         f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    return arch


def build_hf_config(arch: str, meta: dict[str, Any], shapes: dict[str, list[int]]) -> dict[str, Any]:
    """`shapes` are GGUF tensor shapes, fastest dimension first (token_embd is [hidden, vocab])."""
    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}")
        return default if value is None else value

    def need(key: str) -> Any:
        if (value := meta.get(f"{arch}.{key}")) is None:
            raise ValueError(f"GGUF file has no {arch}.{key} (required for architecture {arch!r})")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // heads
    vocab = get("vocab_size") or shapes["token_embd.weight"][-1]
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_GGUF_ARCHITECTURES[arch]],
        "model_type": _MODEL_TYPES.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length") or get("expert_feed_forward_length")
                                 or need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if arch in ("qwen2", "qwen3", "qwen3moe", "qwen2moe"):
        config["use_sliding_window"] = False
    if arch == "llama" and get("expert_count"):
        config.update(_mixtral(need))
    elif arch == "qwen3moe":
        config.update(num_experts=int(need("expert_count")), num_experts_per_tok=int(need("expert_used_count")),
                      moe_intermediate_size=int(need("expert_feed_forward_length")), norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[])
    elif arch == "qwen2moe":
        config.update(_qwen2moe(get, need, shapes))
    elif arch == "deepseek2":
        config.update(_deepseek2(get, need, heads, shapes))
    if (scaling := _rope_scaling(arch, meta)) is not None:
        config["rope_scaling"] = scaling
    config.update(_special_token_ids(meta))
    return config


def _mixtral(need) -> dict[str, Any]:
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": int(need("expert_count")), "num_experts_per_tok": int(need("expert_used_count")),
            "sliding_window": None}


def _qwen2moe(get, need, shapes: dict[str, list[int]]) -> dict[str, Any]:
    shared = get("expert_shared_feed_forward_length")
    if shared is None and "blk.0.ffn_gate_shexp.weight" in shapes:  # older files: from the tensor
        shared = shapes["blk.0.ffn_gate_shexp.weight"][1]
    return {"num_experts": int(need("expert_count")), "num_experts_per_tok": int(need("expert_used_count")),
            "moe_intermediate_size": int(need("expert_feed_forward_length")),
            "shared_expert_intermediate_size": int(shared or 0),
            # llama.cpp's qwen2moe graph does not renormalize the chosen weights unless the file says so
            "norm_topk_prob": bool(get("expert_weights_norm", False)),
            "qkv_bias": "blk.0.attn_q.bias" in shapes, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _deepseek2(get, need, heads: int, shapes: dict[str, list[int]]) -> dict[str, Any]:
    """MLA dims: llama.cpp writes key_length = kv_lora_rank + rope dims (the latent "MQA" head) and
    key_length_mla = nope + rope dims since it splits kv_b into k_b/v_b; older files have only
    key_length/value_length, then the per-head dims. Softmax gating is V2's router (group score:
    the best expert), sigmoid V3's (exp_probs_b biases the choice, group score: best two)."""
    rope_dim = int(need("rope.dimension_count"))
    if get("attention.key_length_mla") is not None:
        qk_head, v_head = int(get("attention.key_length_mla")), int(need("attention.value_length_mla"))
    else:
        qk_head, v_head = int(need("attention.key_length")), int(need("attention.value_length"))
    q_lora = int(get("attention.q_lora_rank", 0) or 0)
    # absent: softmax (llama.cpp's default, for V2/V2.5 files) unless the file has V3's router bias
    # exp_probs_b, which only sigmoid routers have (a V3 config.json without scoring_func converts so)
    v3_bias = any(name.endswith(".exp_probs_b.bias") for name in shapes)
    gating = int(get("expert_gating_func", _GATING_SIGMOID if v3_bias else _GATING_SOFTMAX))
    if gating not in (_GATING_SOFTMAX, _GATING_SIGMOID):
        raise ValueError(f"deepseek2.expert_gating_func must be 1 (softmax) or 2 (sigmoid), got {gating}")
    groups, used_groups = int(get("expert_group_count", 0) or 0), int(get("expert_group_used_count", 0) or 0)
    grouped = groups > 1
    config = {
        "num_key_value_heads": heads, "head_dim": rope_dim, "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": qk_head - rope_dim, "v_head_dim": v_head,
        "kv_lora_rank": int(get("attention.kv_lora_rank") or shapes["blk.0.attn_kv_a_norm.weight"][0]),
        "q_lora_rank": q_lora or None, "rope_interleave": True,  # llama.cpp's NORM rope: adjacent pairs
        "first_k_dense_replace": int(get("leading_dense_block_count", 0)), "moe_layer_freq": 1,
        "n_routed_experts": int(need("expert_count")), "num_experts_per_tok": int(need("expert_used_count")),
        "moe_intermediate_size": int(need("expert_feed_forward_length")),
        "n_shared_experts": int(get("expert_shared_count", 0)),
        "routed_scaling_factor": _f32(get("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(get("expert_weights_norm", False)),
        "n_group": groups if grouped else 1, "topk_group": used_groups if grouped else 1,
        "scoring_func": "sigmoid" if gating == _GATING_SIGMOID else "softmax",
    }
    if gating == _GATING_SIGMOID:
        config.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", topk_method="noaux_tc")
    else:
        config["topk_method"] = "group_limited_greedy" if grouped else "greedy"
    if not q_lora and "blk.0.attn_q.weight" not in shapes:
        raise ValueError("deepseek2 GGUF has neither blk.0.attn_q nor a deepseek2.attention.q_lora_rank")
    return config


def _f32(value: float) -> float:
    """Shortest decimal that round-trips the float32 GGUF value (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(arch: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "type": kind,
                               "factor": _f32(meta.get(f"{arch}.rope.scaling.factor", 1.0))}
    if (orig := meta.get(f"{arch}.rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    if kind == "yarn":
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := meta.get(f"{arch}.rope.scaling.{key}")) is not None:
                scaling[name] = _f32(value)
        # deepseek2 stores 0.1 * mscale_all_dim here; llama.cpp takes mscale == mscale_all_dim
        if arch == "deepseek2" and (log_mul := meta.get(f"{arch}.rope.scaling.yarn_log_multiplier")) is not None:
            scaling["mscale"] = scaling["mscale_all_dim"] = _f32(float(log_mul) / 0.1)
    return scaling


def _special_token_ids(meta: dict[str, Any]) -> dict[str, Any]:
    ids: dict[str, Any] = {}
    if (bos := meta.get("tokenizer.ggml.bos_token_id")) is not None:
        ids["bos_token_id"] = int(bos)
    if (pad := meta.get("tokenizer.ggml.padding_token_id")) is not None:
        ids["pad_token_id"] = int(pad)
    # Chat models often end a turn with eot/eom rather than eos; generation must stop on all.
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                   "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    eos = list(dict.fromkeys(eos))
    if eos:
        ids["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return ids
