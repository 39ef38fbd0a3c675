"""Load weights into our model: Hugging Face safetensors folders (GGUF files are converted to one
first, see gguf_convert.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from tokenmill.models.linear import prepack_linears
from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig
from tokenmill.models.registry import MODEL_CLASSES

# HF name (within a layer) -> (our parameter, shard index within the fused tensor)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0), "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0), "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _fused_offsets(cfg: ModelConfig, name: str) -> list[int]:
    if name == "self_attn.qkv_proj":
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        return [0, q, q + kv, q + 2 * kv]
    return [0, cfg.intermediate_size, 2 * cfg.intermediate_size]


def _target(cfg: ModelConfig, hf_name: str) -> tuple[str, slice | None]:
    name = hf_name.removeprefix("model.")
    if name.startswith("layers."):
        _, idx, rest = name.split(".", 2)
        module, kind = rest.rsplit(".", 1)
        if module in _FUSED:
            fused, shard = _FUSED[module]
            offs = _fused_offsets(cfg, fused)
            return f"layers.{idx}.{fused}.{kind}", slice(offs[shard], offs[shard + 1])
    return name, None


def load_weights(model: LlamaForCausalLM, folder: str | Path, dtype: torch.dtype) -> None:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(folder)!r}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for hf_name in tqdm(list(f.keys()), desc=f"loading {file.name}", leave=False, disable=None):
                if "rotary_emb" in hf_name:
                    continue
                name, rows = _target(model.config, hf_name)
                if name not in params:
                    raise ValueError(f"unexpected weight {hf_name!r} in {file.name}")
                tensor = f.get_tensor(hf_name)
                with torch.no_grad():
                    dst = params[name] if rows is None else params[name][rows]
                    if dst.shape != tensor.shape:
                        raise ValueError(f"weight {hf_name!r}: shape {tuple(tensor.shape)}, "
                                         f"expected {tuple(dst.shape)}")
                    dst.copy_(tensor.to(dtype))
                loaded.add(name)
    if model.config.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = set(params) - loaded
    if missing:
        raise ValueError(f"weights missing for: {sorted(missing)[:5]}")


def build_model(cfg: ModelConfig, folder: str | Path, dtype: torch.dtype, max_positions: int) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg, max_positions)
    model = model.to_empty(device="cpu").to(dtype)
    # Buffers (rope tables) were created on meta; rebuild them for real.
    rope = type(model.layers[0].self_attn.rope)(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
    for layer in model.layers:
        layer.self_attn.rope = rope
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    load_weights(model, folder, dtype)
    model = model.eval().requires_grad_(False)
    prepack_linears(model)
    return model
