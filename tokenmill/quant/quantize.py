"""The weight quantizers behind `tokenmill quantize` (cli_quantize.py, where each method is
described): round to nearest (int8 per channel, int4 per group with a zero point) and AWQ's
activation-aware scales, written in AutoAWQ's or compressed-tensors' layout."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from tokenmill.cli_quantize import FORMATS, METHODS
from tokenmill.quant import compressed_tensors as ct
from tokenmill.quant.awq_gptq import fake_quantize_int4_zero_point, quantize_int4_zero_point, write_awq_linear

logger = logging.getLogger(__name__)

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALPHAS = [i / 20 for i in range(21)]


def quantize_model(model: str | None, out: str | Path, method: str = "awq", group_size: int = 128,
                   calibration_tokens: int = 512, fmt: str | None = None) -> Path:
    from tokenmill.engine.resolve import resolve_model_folder
    from tokenmill.models.loader import iter_safetensors
    from tokenmill.models.model_config import read_hf_config
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    fmt = fmt or ("compressed-tensors" if method == "int8" else "awq")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if method == "int8" and fmt == "awq":
        raise ValueError("format='awq' holds 4-bit weights only; int8 is written as format='compressed-tensors'")
    src = resolve_model_folder(model)
    hf = read_hf_config(src)
    if hf.get("quantization_config"):
        raise ValueError(f"{str(src)!r} is already quantized ({hf['quantization_config'].get('quant_method')})")
    tensors = {name: t.float() for name, t in iter_safetensors(src)}
    if method == "awq":
        apply_awq_scales(tensors, _calibration_inputs(model, calibration_tokens), hf, group_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    scheme = ct.writer_scheme(8 if method == "int8" else 4, group_size) if fmt == "compressed-tensors" else None
    written: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not _is_quantized_linear(name, t):
            written[name] = t.contiguous()
            continue
        parts = ct.compress_linear(t, scheme) if scheme is not None else \
            write_awq_linear(quantize_int4_zero_point(t, group_size), group_size)
        for key, value in parts.items():
            written[f"{name[: -len('.weight')]}.{key}"] = value.contiguous()
    save_file(written, str(out / "model.safetensors"), metadata={"format": "pt"})
    if scheme is None:
        hf["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                     "version": "gemm", "tokenmill_method": method}
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if scheme is not None:
        ct.write_config(out, scheme)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
            shutil.copy(f, out / f.name)
    logger.info("wrote %s (%s layout, group %s) to %s", method, fmt, "per channel" if method == "int8" else group_size,
                out)
    return out


def _is_quantized_linear(name: str, t: torch.Tensor) -> bool:
    return t.dim() == 2 and name.startswith("model.layers.") and name.endswith(tuple(f"{p}.weight" for p in _PROJ))


# -- calibration ----------------------------------------------------------------------------------
def _calibration_inputs(model: str | None, num_tokens: int) -> dict[str, torch.Tensor]:
    """Inputs of every fused linear of the float model over the calibration text: our module name
    (layers.i.self_attn.qkv_proj, ...) -> [tokens, in] float32."""
    from tokenmill import LLM
    from tokenmill.data import read_text
    from tokenmill.eval.kv_quality import chunked_scores
    from tokenmill.models.linear import Linear
    llm = LLM(model, dtype="float32", quantization="none", kv_cache_memory_gb=0.1)
    text = "\n\n".join(json.loads(read_text("passages.json")))
    ids = llm.get_tokenizer().encode(text)[:num_tokens]
    captured: dict[str, list[torch.Tensor]] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: captured.setdefault(name, []).append(
        args[0].detach().float().clone())) for name, m in llm.llm_engine.runner.model.named_modules()
        if isinstance(m, Linear) and name.startswith("layers.")]
    try:
        chunked_scores(llm.llm_engine, ids)
    finally:
        for h in hooks:
            h.remove()
    return {name: torch.cat(xs) for name, xs in captured.items()}


def apply_awq_scales(tensors: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor], hf: dict, group: int) -> None:
    gqa = hf.get("num_key_value_heads", hf["num_attention_heads"]) != hf["num_attention_heads"]
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}"
        groups = [(f"layers.{i}.self_attn.qkv_proj", [f"{p}.self_attn.{n}_proj.weight" for n in "qkv"],
                   f"{p}.input_layernorm.weight"),
                  (f"layers.{i}.mlp.gate_up_proj", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"],
                   f"{p}.post_attention_layernorm.weight"),
                  (f"layers.{i}.mlp.down_proj", [f"{p}.mlp.down_proj.weight"], f"{p}.mlp.up_proj.weight")]
        if not gqa:
            groups.append((f"layers.{i}.self_attn.o_proj", [f"{p}.self_attn.o_proj.weight"],
                           f"{p}.self_attn.v_proj.weight"))
        for ours, names, previous in groups:
            if ours not in inputs or previous not in tensors or not all(n in tensors for n in names):
                continue
            s = best_scale(inputs[ours], [tensors[n] for n in names], group)
            for n in names:
                tensors[n] = tensors[n] * s
            prev = tensors[previous]
            tensors[previous] = prev / s if prev.dim() == 1 else prev / s[:, None]  # a norm, or the rows feeding x


def best_scale(x: torch.Tensor, weights: list[torch.Tensor], group: int) -> torch.Tensor:
    """The activation-aware per-input-channel scale for weights sharing the input x [tokens, in]."""
    w = torch.cat(weights)
    ref = x @ w.T
    mean_abs = x.abs().mean(0).clamp(min=1e-5)
    best, best_err = torch.ones_like(mean_abs), float("inf")
    for alpha in ALPHAS:
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        q = fake_quantize_int4_zero_point(w * s, group)
        err = torch.mm(x / s, q.T).sub_(ref).square_().mean().item()
        if err < best_err:
            best, best_err = s, err
    return best
