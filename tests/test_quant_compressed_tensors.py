"""compressed-tensors checkpoints (tokenmill/quant/compressed_tensors.py): folders written by the
`compressed-tensors` library's own model flow (apply the scheme, min/max scales, compress_model —
what llm-compressor does for round-to-nearest) and by `tokenmill quantize --format
compressed-tensors` load with their weights exactly as the library decompresses them (tolerance
2**-10 of max|w|: the library decompresses to float16, and our records keep scales and minimums in
float16, each within 2**-11), and generate; the schemes we cannot run are refused naming their
field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokenmill import LLM, SamplingParams
from tokenmill.kernels import cpu_ops
from tokenmill.quant.quantize import quantize_model

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor, ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,  # noqa: E402
                                             apply_quantization_config)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

needs_kernels = pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SCHEMES = {
    "w8a16-channel": (dict(num_bits=8, symmetric=True, strategy="channel"), "int-quantized"),
    "w4a16-group32-sym": (dict(num_bits=4, symmetric=True, strategy="group", group_size=32), "pack-quantized"),
    "w4a16-group64-asym": (dict(num_bits=4, symmetric=False, strategy="group", group_size=64), "pack-quantized"),
    "w4a16-channel": (dict(num_bits=4, symmetric=True, strategy="channel"), "pack-quantized"),
}


def library_checkpoint(src: Path, out: Path, args: dict, fmt: str) -> Path:
    """Quantize a float folder with compressed-tensors' model-level API and save it."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(type="int", **args))
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                                                        format=fmt))
    for module in model.modules():
        s = getattr(module, "quantization_scheme", None)
        if s is None:
            continue
        w = module.weight.data
        size = s.weights.group_size or w.shape[1]
        g = w.view(w.shape[0], -1, size)
        scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), s.weights)
        module.weight_scale.data.copy_(scale)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    shutil.copytree(src, out)
    for f in out.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    compressor.update_config(str(out))
    return out


def library_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every quantized linear's float weight, as the library decompresses it."""
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    group = qc["config_groups"]["group_0"]
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**group["weights"]))
    compressor = BaseCompressor.load_from_registry(group.get("format") or qc["format"])
    saved = load_file(str(folder / "model.safetensors"))
    prefixes = {k.rsplit(".", 1)[0] for k in saved if k.endswith("weight_scale")}
    out = {}
    for p in prefixes:
        state = {k.rsplit(".", 1)[1]: v for k, v in saved.items() if k.startswith(p + ".")}
        out[p] = compressor.decompress(state, scheme)["weight"].float()
    return out


def assert_loaded_like_library(llm: LLM, folder: Path, bits: int) -> None:
    ref = library_weights(folder)
    assert len(ref) == 2 * len(PROJ)  # 2 layers, every projection quantized, lm_head ignored
    modules = dict(llm.llm_engine.runner.model.named_modules())
    for fused, parts in (("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")), ("self_attn.o_proj", ("o_proj",)),
                         ("mlp.gate_up_proj", ("gate_proj", "up_proj")), ("mlp.down_proj", ("down_proj",))):
        for layer in (0, 1):
            module = modules[f"layers.{layer}.{fused}"]
            assert module.bits == bits
            w = torch.ops.tokenmill.q_dequantize(module.records, bits, module.out_features, module.in_features)
            kind = fused.split(".")[0]
            expected = torch.cat([ref[f"model.layers.{layer}.{kind}.{p}"] for p in parts])
            torch.testing.assert_close(w, expected, rtol=0, atol=expected.abs().max().item() / 1024)
    assert modules["lm_head"].__class__.__name__ == "Linear" and getattr(modules["lm_head"], "records", None) is None


@needs_kernels
@pytest.mark.parametrize("name", list(SCHEMES))
def test_library_written_checkpoint_loads_exactly(tiny_llama, tmp_path, name):
    args, fmt = SCHEMES[name]
    folder = library_checkpoint(Path(tiny_llama), tmp_path / name, args, fmt)
    llm = LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.01)
    assert llm.llm_engine.config.model.quantization == "compressed-tensors"  # read from config.json
    assert_loaded_like_library(llm, folder, args["num_bits"])
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8


@needs_kernels
@pytest.mark.parametrize("method", ["int8", "int4", "awq"])
def test_quantize_writes_compressed_tensors(tiny_llama, tmp_path, method):
    out = quantize_model(str(tiny_llama), tmp_path / method, method, group_size=32, calibration_tokens=64,
                         fmt="compressed-tensors")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["quantization_status"] == "compressed"
    assert qc["format"] == ("int-quantized" if method == "int8" else "pack-quantized")
    llm = LLM(str(out), dtype="float32", kv_cache_memory_gb=0.01)
    assert_loaded_like_library(llm, out, 8 if method == "int8" else 4)
    with pytest.raises(ValueError, match="holds a compressed-tensors checkpoint"):
        LLM(str(out), quantization="awq")


def test_int8_has_no_awq_layout(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="int8 is written as format='compressed-tensors'"):
        quantize_model(str(tiny_llama), tmp_path / "x", "int8", fmt="awq")


@pytest.mark.parametrize("change, field", [
    (lambda q: q["config_groups"]["group_0"].update(input_activations={"num_bits": 8, "type": "int"}),
     "config_groups.group_0.input_activations"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(type="float"), "config_groups.group_0.weights.type"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=2), "config_groups.group_0.weights.num_bits"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(actorder="group"),
     "config_groups.group_0.weights.actorder"),
    (lambda q: q.update(format="float-quantized"), "quantization_config.format"),
    (lambda q: q.update(quantization_status="frozen"), "quantization_config.quantization_status"),
])
def test_unsupported_schemes_name_their_field(tiny_llama, tmp_path, change, field):
    folder = quantize_model(str(tiny_llama), tmp_path / "ct", "int4", group_size=32, fmt="compressed-tensors")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"].pop("format", None)
    change(cfg["quantization_config"])
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.01)
