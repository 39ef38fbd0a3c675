"""Write a tiny Hugging Face model folder as a GGUF in llama.cpp's layout: the keys, tensor names,
Q/K row permutation, stacked experts and split MLA kv_b that llama.cpp's convert_hf_to_gguf.py
writes for Mixtral (`llama`), Qwen2-MoE (`qwen2moe`) and DeepSeek-V2/V3 (`deepseek2`).

Test-side only, written from llama.cpp's documented layout (gguf-py's names and `Keys`), so the
tests check that our reader (tokenmill/models/gguf_arch.py, gguf_tensors.py) maps what llama.cpp
produces, not what our own writer would."""
from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize as gguf_quantize
from safetensors.numpy import load_file

_ARCH = {"MixtralForCausalLM": "llama", "Qwen2MoeForCausalLM": "qwen2moe",
         "DeepseekV2ForCausalLM": "deepseek2", "DeepseekV3ForCausalLM": "deepseek2"}
_NAMES = {  # HF module (after model.layers.N.) -> GGUF tensor (after blk.N.)
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
}
_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$")
_EXPERT_KINDS = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps", "gate_proj": "ffn_gate_exps",
                 "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rope halves interleaved row by row."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llamacpp_gguf(folder: Path, path: Path, *, split_kv_b: bool = True, experts: str = "stacked",
                        quantize: dict[str, QT] | None = None) -> Path:
    """`split_kv_b`: DeepSeek's kv_b as attn_k_b/attn_v_b (llama.cpp since its MLA rework) or one
    attn_kv_b (older files, with the older key_length meaning). `experts`: "stacked"
    (ffn_{gate,up,down}_exps), "gate_up" (ffn_gate_up_exps: gate rows then up rows, the converter's
    --fuse-gate-up-exps) or "legacy" (one ffn_{gate,up,down}.{expert} tensor each, pre-2024 files).
    `quantize`: GGUF tensor kind (e.g. "ffn_up_exps") -> block type to store it in."""
    hf = json.loads((folder / "config.json").read_text())
    arch = _ARCH[hf["architectures"][0]]
    tensors = _tensors(hf, arch, load_file(str(folder / "model.safetensors")), split_kv_b, experts)
    writer = gguf.GGUFWriter(str(path), arch)
    _add_keys(writer, hf, arch, split_kv_b)
    _add_vocab(writer, folder, hf["vocab_size"])
    for name, array in tensors.items():
        kind = name.split(".")[-2]
        if quantize and kind in quantize:
            writer.add_tensor(name, gguf_quantize(array, quantize[kind]), raw_dtype=quantize[kind])
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensors(hf: dict, arch: str, weights: dict[str, np.ndarray], split_kv_b: bool,
             expert_layout: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {"token_embd.weight": weights["model.embed_tokens.weight"],
                                  "output_norm.weight": weights["model.norm.weight"]}
    if "lm_head.weight" in weights:
        out["output.weight"] = weights["lm_head.weight"]
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    heads = hf["num_attention_heads"]
    for name, w in weights.items():
        if (m := _EXPERT.match(name)) is not None:
            experts.setdefault((int(m.group(1)), _EXPERT_KINDS[m.group(3)]), {})[int(m.group(2))] = w
            continue
        if not name.startswith("model.layers."):
            continue
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        if rest.endswith("e_score_correction_bias"):  # DeepSeek-V3
            out[f"blk.{layer}.exp_probs_b.bias"] = w
            continue
        module, suffix = rest.rsplit(".", 1)
        kind = _NAMES[module]
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            w = llamacpp_permute(w, heads if kind == "attn_q" else hf["num_key_value_heads"])
        if kind == "attn_kv_b" and split_kv_b:
            nope, v = hf["qk_nope_head_dim"], hf["v_head_dim"]
            kv_b = w.reshape(heads, nope + v, -1)
            out[f"blk.{layer}.attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
            out[f"blk.{layer}.attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, nope:])
            continue
        out[f"blk.{layer}.{kind}.{suffix}"] = w
    for (layer, kind), per_expert in sorted(experts.items()):
        if expert_layout == "legacy":
            for e, w in sorted(per_expert.items()):
                out[f"blk.{layer}.{kind.removesuffix('_exps')}.{e}.weight"] = w
            continue
        out[f"blk.{layer}.{kind}.weight"] = np.stack([per_expert[e] for e in range(len(per_expert))])
    if expert_layout == "gate_up":
        for layer in range(hf["num_hidden_layers"]):
            if f"blk.{layer}.ffn_gate_exps.weight" in out:
                gate, up = out.pop(f"blk.{layer}.ffn_gate_exps.weight"), out.pop(f"blk.{layer}.ffn_up_exps.weight")
                out[f"blk.{layer}.ffn_gate_up_exps.weight"] = np.concatenate([gate, up], axis=1)
    return out


def _add_keys(writer: gguf.GGUFWriter, hf: dict, arch: str, split_kv_b: bool) -> None:
    rope = hf.get("rope_parameters") or {}
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if arch != "qwen2moe":
        writer.add_vocab_size(hf["vocab_size"])
    experts = hf.get("num_local_experts") or hf.get("num_experts") or hf.get("n_routed_experts")
    writer.add_expert_count(experts)
    writer.add_expert_used_count(hf["num_experts_per_tok"])
    if hf.get("n_group") is not None:  # TextModel: n_group / topk_group when the config has them
        writer.add_expert_group_count(hf["n_group"])
        writer.add_expert_group_used_count(hf["topk_group"])
    if arch == "llama":
        writer.add_head_count_kv(hf["num_key_value_heads"])
        writer.add_rope_dimension_count(hf["hidden_size"] // hf["num_attention_heads"])
    elif arch == "qwen2moe":
        writer.add_head_count_kv(hf["num_key_value_heads"])
        writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(hf["shared_expert_intermediate_size"])
    else:
        _add_deepseek2_keys(writer, hf, split_kv_b)


def _add_deepseek2_keys(writer: gguf.GGUFWriter, hf: dict, split_kv_b: bool) -> None:
    nope, rope, v, kv_lora = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"], hf["kv_lora_rank"]
    if hf.get("scoring_func") is not None:  # only when config.json names it (DeepSeek's own configs do)
        sigmoid = hf["scoring_func"] == "sigmoid"
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sigmoid else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_leading_dense_block_count(hf["first_k_dense_replace"])
    if hf.get("q_lora_rank"):
        writer.add_q_lora_rank(hf["q_lora_rank"])
    writer.add_kv_lora_rank(kv_lora)
    if split_kv_b:  # MLA as MQA over the latent: one "KV head" of kv_lora + rope dims
        writer.add_head_count_kv(1)
        writer.add_key_length(kv_lora + rope)
        writer.add_value_length(kv_lora)
        writer.add_key_length_mla(nope + rope)
        writer.add_value_length_mla(v)
    else:  # older files: per-head dims
        writer.add_head_count_kv(hf["num_attention_heads"])
        writer.add_key_length(nope + rope)
        writer.add_value_length(v)
    writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])
    writer.add_expert_shared_count(hf["n_shared_experts"])
    writer.add_expert_weights_scale(hf["routed_scaling_factor"])
    if hf.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    writer.add_rope_dimension_count(rope)
    scaling = hf.get("rope_parameters") or {}
    if scaling.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * scaling["mscale_all_dim"])
        writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])


def _add_vocab(writer: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    """The folder's byte-level BPE vocabulary as llama.cpp's gpt2 tokenizer keys, padded to the
    model's vocab size with [PADn] tokens."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    specials = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    by_id.update({i: t for t, i in specials.items()})
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [3 if t in specials else 1 if i in by_id else 5 for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(specials["<s>"])
    writer.add_eos_token_id(specials["</s>"])
