"""4-bit checkpoints in AutoAWQ's and GPTQ's layouts (tokenmill/quant/awq_gptq.py, checkpoint.py,
quantize.py): our writer and readers against the layouts' definitions, `tokenmill quantize` folders
loading back exactly, a hand-made GPTQ act-order checkpoint, and AWQ no worse than round-to-nearest
at the same bits."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokenmill import LLM
from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear
from tokenmill.quant.awq_gptq import AWQ_ORDER, fake_quantize_int4_zero_point, quantize_int4_zero_point, \
    read_awq_linear, read_gptq_linear, write_awq_linear
from tokenmill.quant.quantize import best_scale, quantize_model

needs_kernels = pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")


def test_awq_packing_follows_the_layout():
    """Column AWQ_ORDER[i] of each 8 sits in nibble i of qweight; w = (code - zero) * scale."""
    w = quantize_int4_zero_point(torch.randn(16, 64), 32)
    t = write_awq_linear(w, 32)
    assert t["qweight"].shape == (64, 2) and t["qzeros"].shape == (2, 2) and t["scales"].shape == (2, 16)
    codes_in_out = w.codes.T  # [in, out]
    for i, col in enumerate(AWQ_ORDER):
        nibble = (t["qweight"] >> (4 * i)) & 0xF
        assert torch.equal(nibble[:, 0], codes_in_out[:, col].to(torch.int32))
    back = read_awq_linear(t["qweight"], t["qzeros"], t["scales"], 32)
    assert torch.equal(back.codes, w.codes)
    zeros = torch.stack([(t["qzeros"] >> (4 * i)) & 0xF for i in range(8)], -1).reshape(2, 16)  # nibble order
    zeros = zeros[:, [AWQ_ORDER.index(c % 8) + 8 * (c // 8) for c in range(16)]]
    expected = (codes_in_out.float() - zeros.float().repeat_interleave(32, 0)) * t["scales"].float().repeat_interleave(32, 0)
    torch.testing.assert_close(back.dequantize(), expected.T, rtol=0, atol=1e-6)


def _gptq_pack(codes_in_out: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ v1: qweight [in/8, out] with input row 8r+i in nibble i; qzeros [groups, out/8] sequential, zero - 1."""
    n_in, n_out = codes_in_out.shape
    qweight = torch.zeros(n_in // 8, n_out, dtype=torch.int32)
    for i in range(8):
        qweight |= codes_in_out[i::8].to(torch.int32) << (4 * i)
    z = (zeros - 1).to(torch.int32)
    qzeros = torch.zeros(z.shape[0], n_out // 8, dtype=torch.int32)
    for i in range(8):
        qzeros |= z[:, i::8] << (4 * i)
    return qweight, qzeros


def test_gptq_act_order_reads_through_a_permutation():
    gen = torch.Generator().manual_seed(0)
    n_in, n_out, group = 128, 16, 32
    codes = torch.randint(0, 16, (n_in, n_out), generator=gen, dtype=torch.uint8)
    zeros = torch.randint(1, 15, (n_in // group, n_out), generator=gen)
    scales = (torch.rand(n_in // group, n_out, generator=gen) * 0.1).half()
    perm = torch.randperm(n_in, generator=gen)
    g_idx = torch.empty(n_in, dtype=torch.int32)
    g_idx[perm] = (torch.arange(n_in) // group).to(torch.int32)  # act-order: groups in a shuffled input order
    qweight, qzeros = _gptq_pack(codes, zeros)
    blocks, p = read_gptq_linear(qweight, qzeros, scales, g_idx, group)
    w_true = ((codes.float() - zeros.float()[g_idx.long()]) * scales.float()[g_idx.long()]).T  # [out, in]
    x = torch.randn(3, n_in, generator=gen)
    torch.testing.assert_close(x[:, p] @ blocks.dequantize().T, x @ w_true.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_fake_quantize_is_quantize_then_dequantize_bit_for_bit(group):
    """The AWQ search's shortcut gives exactly the weights the written checkpoint will hold."""
    gen = torch.Generator().manual_seed(group)
    w = torch.randn(24, 256, generator=gen) * torch.logspace(-2, 1, 256)
    w[3] = 0  # an all-zero row: scale clamps at fp16's smallest subnormal, not 0 (NaN zero points)
    w[5, :group] = w[5, :group].abs()  # a group without negatives: zero point 0
    fake = fake_quantize_int4_zero_point(w, group)
    assert torch.equal(fake, quantize_int4_zero_point(w, group).dequantize())
    assert not fake.isnan().any() and torch.equal(fake[3], w[3])  # zeros stay zeros (they were NaN)


def test_awq_search_never_loses_to_round_to_nearest():
    """alpha = 0 (no scaling) is on the grid, so the chosen scale's calibration error is at most RTN's."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=gen) * torch.logspace(-1, 1, 128)  # channels of very different size
    w = torch.randn(48, 128, generator=gen) * 0.1
    s = best_scale(x, [w], 32)

    def err(scale):
        q = quantize_int4_zero_point(w * scale, 32).dequantize()
        return ((x / scale) @ q.T - x @ w.T).pow(2).mean().item()
    assert err(s) <= err(torch.ones(128)) and not torch.equal(s, torch.ones(128))


@needs_kernels
@pytest.mark.parametrize("method", ["int4", "awq"])
def test_quantize_writes_a_folder_that_loads_back(tiny_llama, tmp_path, method):
    out = quantize_model(str(tiny_llama), tmp_path / method, method, group_size=32, calibration_tokens=64)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq" and cfg["quantization_config"]["version"] == "gemm"
    saved = load_file(str(out / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.qweight" in saved and "model.layers.0.self_attn.q_proj.weight" not in saved
    llm = LLM(str(out), dtype="float32", kv_cache_memory_gb=0.01)
    assert llm.llm_engine.config.model.quantization == "awq"  # read from config.json
    model = llm.llm_engine.runner.model
    layer = dict(model.named_modules())["layers.0.self_attn.qkv_proj"]
    parts = [read_awq_linear(saved[f"model.layers.0.self_attn.{n}_proj.qweight"],
                             saved[f"model.layers.0.self_attn.{n}_proj.qzeros"],
                             saved[f"model.layers.0.self_attn.{n}_proj.scales"], 32).dequantize() for n in "qkv"]
    w = torch.ops.tokenmill.q_dequantize(layer.records, 4, layer.out_features, layer.in_features)
    ref = torch.cat(parts)  # the records store -zero * scale as float16: within 2**-11 of |w|
    torch.testing.assert_close(w, ref, rtol=0, atol=ref.abs().max().item() / 2048)
    assert not isinstance(model.lm_head.quant_method, type(layer.quant_method))
    with pytest.raises(ValueError, match="holds a awq checkpoint"):
        LLM(str(out), quantization="int8")


def test_awq_request_without_checkpoint_is_refused(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="quantization='gptq' needs a folder"):
        LLM(str(tiny_llama), quantization="gptq")
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'bitsandbytes' is not supported"):
        LLM(str(bad))


@needs_kernels
def test_awq_no_worse_than_rtn_on_the_default_model(tmp_path):
    from tokenmill.data import read_text
    from tokenmill.eval.kv_quality import chunked_scores
    ppl = {}
    for method in ("int4", "awq"):
        out = quantize_model(None, tmp_path / method, method, group_size=64, calibration_tokens=128)
        llm = LLM(str(out), dtype="float32", kv_cache_memory_gb=0.1)
        ids = llm.get_tokenizer().encode(read_text("alice_ch1_2.txt"))[:384]
        logp, _ = chunked_scores(llm.llm_engine, ids)
        ppl[method] = math.exp(-logp.mean().item())
    assert ppl["awq"] <= ppl["int4"], ppl
