"""GGUF tensors -> the Hugging Face checkpoint tensors our models load, in llama.cpp's layout.

What llama.cpp's converter did, undone here (names as in gguf-py's TENSOR_NAMES):
- `llama` Q/K rows are permuted (each head's two rope halves interleaved): un-permuted.
- MoE experts are one stacked tensor per kind, `ffn_{gate,up,down}_exps` [experts, rows, cols]
  (or `ffn_gate_up_exps`, gate rows then up rows): split into one tensor per expert. Files from
  before the stacking hold `ffn_{gate,up,down}.{expert}` tensors, also read.
- Shared experts `ffn_*_shexp`, Qwen2-MoE's shared-expert gate `ffn_gate_inp_shexp`, DeepSeek-V3's
  router bias `exp_probs_b`.
- DeepSeek MLA: `attn_q` or `attn_q_a`/`attn_q_a_norm`/`attn_q_b`, `attn_kv_a_mqa`, `attn_kv_a_norm`,
  and `attn_kv_b` — or, in newer files, `attn_k_b` (per head, transposed) and `attn_v_b`, joined
  back into kv_b_proj.

Splits act on rows only, so they apply alike to float arrays and to rows of quantized blocks
(`keep_blocks`: the GGUF block types the caller keeps as they are)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

SKIPPED_TENSORS = {"rope_freqs.weight"}  # llama.cpp computes it; llama3-style rope scaling is not rebuilt

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3: per-head q/k RMSNorm
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_a": "self_attn.q_a_proj",  # DeepSeek MLA
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",  # Qwen2-MoE
}
_EXPERT_KINDS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_SHARED_KINDS = {"ffn_gate_shexp": "gate_proj", "ffn_up_shexp": "up_proj", "ffn_down_shexp": "down_proj"}
_MIXTRAL_KINDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# modules that compute in float (routers, gates, MLA's kv_b): never handed quantized blocks
_PLAIN = {"ffn_gate_inp", "ffn_gate_inp_shexp", "exp_probs_b", "attn_kv_b", "attn_k_b", "attn_v_b"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_LEGACY_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")


@dataclass
class HFTensor:
    name: str
    data: np.ndarray  # float32, or raw block rows [rows, bytes] when block_type is set
    block_type: str | None
    cols: int  # inputs per row
    source_type: str  # the GGUF tensor type it came from
    plain: bool  # its module computes in float


class GGUFTensorNames:
    """GGUF tensor names -> HF names for one model (its config.json, from gguf_arch)."""

    def __init__(self, gguf_arch: str, hf_config: dict[str, Any]) -> None:
        self.hf_arch = hf_config["architectures"][0]
        self.moe = "block_sparse_moe" if self.hf_arch == "MixtralForCausalLM" else "mlp"
        self.shared = "shared_expert" if self.hf_arch == "Qwen2MoeForCausalLM" else "shared_experts"
        heads = hf_config["num_attention_heads"]
        self.qk_heads = ({"attn_q": heads, "attn_k": hf_config["num_key_value_heads"]}
                         if gguf_arch == "llama" else {})
        self.mla_dims = (heads, hf_config.get("qk_nope_head_dim"), hf_config.get("v_head_dim"))

    def block_name(self, layer: str, part: str, suffix: str) -> str:
        prefix = f"model.layers.{layer}."
        if part == "ffn_gate_inp":
            return f"{prefix}{self.moe}.gate.{suffix}"
        if part == "exp_probs_b":
            return f"{prefix}mlp.gate.e_score_correction_bias"
        if part in _SHARED_KINDS:
            return f"{prefix}mlp.{self.shared}.{_SHARED_KINDS[part]}.{suffix}"
        if part in _BLOCK_NAMES:
            return f"{prefix}{_BLOCK_NAMES[part]}.{suffix}"
        raise ValueError(f"unknown GGUF tensor blk.{layer}.{part}.{suffix}; cannot map it to a Hugging Face name")

    def expert_name(self, layer: str, expert: int, kind: str) -> str:
        if self.moe == "block_sparse_moe":
            kind = _MIXTRAL_KINDS[kind]
        return f"model.layers.{layer}.{self.moe}.experts.{expert}.{kind}.weight"

    def global_name(self, gguf_name: str) -> str:
        base, _, suffix = gguf_name.rpartition(".")
        if base not in _GLOBAL_NAMES:
            raise ValueError(f"unknown GGUF tensor {gguf_name!r}; cannot map it to a Hugging Face name")
        return f"{_GLOBAL_NAMES[base]}.{suffix}"

    def join_kv_b(self, k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
        """k_b [heads, kv_lora, nope] (transposed per head) + v_b [heads, v, kv_lora]
        -> kv_b [heads * (nope + v), kv_lora]."""
        heads, nope, v = self.mla_dims
        k = k_b.reshape(heads, -1, nope).transpose(0, 2, 1)
        return np.concatenate([k, v_b.reshape(heads, v, -1)], axis=1).reshape(heads * (nope + v), -1)


def iter_hf_tensors(reader, gguf_arch: str, hf_config: dict[str, Any],
                    keep_blocks: tuple[str, ...] = ()) -> Iterator[HFTensor]:
    """Every GGUF tensor as the HF tensor(s) it holds, in file order."""
    names = GGUFTensorNames(gguf_arch, hf_config)
    mla_halves: dict[tuple[str, str], np.ndarray] = {}
    for t in reader.tensors:
        if t.name in SKIPPED_TENSORS:
            continue
        yield from _split(t, names, keep_blocks, mla_halves)
    if mla_halves:
        raise ValueError(f"GGUF tensors without their MLA pair (attn_k_b / attn_v_b): {sorted(mla_halves)}")


def _split(t, names: GGUFTensorNames, keep_blocks: tuple[str, ...], mla_halves) -> Iterator[HFTensor]:
    from gguf.quants import dequantize

    type_name = t.tensor_type.name
    legacy, block = _LEGACY_EXPERT_RE.match(t.name), _BLOCK_RE.match(t.name)
    part = block.group(2) if block else None
    plain = part in _PLAIN
    shape = [int(s) for s in t.shape]  # fastest dimension first
    cols = shape[0]
    kept = type_name if type_name in keep_blocks and not plain and len(shape) >= 2 else None
    raw = np.asarray(t.data).reshape(*reversed(shape[1:]), -1)  # rows (of blocks, or of values)

    def load(rows: np.ndarray) -> np.ndarray:
        """Kept blocks as they are; anything else dequantized, one (expert's) slice at a time, into
        a copy (F32 tensors come back as read-only views of the memory-mapped file)."""
        return rows if kept else np.array(dequantize(rows, t.tensor_type), dtype=np.float32, order="C")

    def out(name: str, array: np.ndarray) -> HFTensor:
        return HFTensor(name, np.ascontiguousarray(array), kept, cols, type_name, plain)

    if legacy:
        layer, kind, expert = legacy.groups()
        yield out(names.expert_name(layer, int(expert), f"{kind}_proj"), load(raw))
    elif block is None:
        yield out(names.global_name(t.name), load(raw))
    elif part in ("attn_k_b", "attn_v_b"):
        layer = block.group(1)
        mla_halves[(layer, part)] = load(raw)
        if (layer, "attn_k_b") in mla_halves and (layer, "attn_v_b") in mla_halves:
            kv_b = names.join_kv_b(mla_halves.pop((layer, "attn_k_b")), mla_halves.pop((layer, "attn_v_b")))
            yield HFTensor(names.block_name(layer, "attn_kv_b", "weight"), kv_b, None, kv_b.shape[1], type_name, True)
    elif part in _EXPERT_KINDS or part == "ffn_gate_up_exps":
        layer = block.group(1)
        for e, expert_rows in enumerate(raw):  # [experts, rows, cols]
            rows = load(expert_rows)
            if part == "ffn_gate_up_exps":
                half = rows.shape[0] // 2
                yield out(names.expert_name(layer, e, "gate_proj"), rows[:half])
                yield out(names.expert_name(layer, e, "up_proj"), rows[half:])
            else:
                yield out(names.expert_name(layer, e, _EXPERT_KINDS[part]), rows)
    else:
        data = load(raw)
        if part in names.qk_heads and block.group(3) == "weight":
            data = unpermute_qk_rows(data, names.qk_heads[part])
        if part == "ffn_gate_inp_shexp":
            data = data.reshape(1, -1)  # [hidden] or [1, hidden] in the file; HF's Linear(hidden, 1)
        yield out(names.block_name(*block.groups()), data)


def unpermute_qk_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (it interleaves each head's two rope halves). Rows move
    whole, so this works on float rows and on rows of quantized blocks alike."""
    half = rows.shape[0] // n_head // 2
    w = rows.reshape(n_head, half, 2, *rows.shape[1:])
    return w.swapaxes(1, 2).reshape(rows.shape)
