"""quantization="int8" / "int4": weight-only round-to-nearest at load (tokenmill/quant/rtn.py).
The rules are checked element-wise (every weight within half a quantization step of its float value),
the engine on the tiny Llama against its float32 self (logits within 3% of their range: 8 or 4 bits
of weights plus int8 activations), and the default model's perplexity (int8 within 1% of float32)."""
from __future__ import annotations

import math

import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear
from tokenmill.quant.blocks import BlockLinearMethod, quantize_int4, quantize_int8_per_channel


def test_int8_per_channel_rule():
    w = torch.randn(8, 96) * torch.linspace(0.1, 3, 8)[:, None]
    q = quantize_int8_per_channel(w)
    d = (w.abs().amax(1) / 127).half().float()
    assert q.bits == 8 and q.codes.dtype == torch.int8 and q.d.shape == (8, 3)
    assert torch.equal(q.d, d[:, None].expand(8, 3))  # one scale per row, repeated per block
    assert ((q.dequantize() - w).abs() <= d[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_group_rule(group):
    w = torch.randn(6, 256)
    q = quantize_int4(w, group)
    g = w.view(6, 256 // group, group)
    d = ((g.amax(-1) - g.amin(-1)) / 15).half().float()
    assert q.bits == 4 and int(q.codes.max()) <= 15 and q.d.shape == (6, 8)
    assert torch.equal(q.d, d.repeat_interleave(group // 32, 1))
    err = (q.dequantize() - w).view(6, 256 // group, group).abs()
    assert (err <= d[..., None] / 2 + 2e-3 * g.abs().amax(-1, keepdim=True)).all()  # + float16 rounding of min


@pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_tiny_llama_int_formats_track_float(tiny_llama, quantization):
    ids = list(range(5, 45))
    ref = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01)
    q = LLM(str(tiny_llama), dtype="float32", quantization=quantization, kv_cache_memory_gb=0.01)
    model = q.llm_engine.runner.model
    methods = {n: type(m.quant_method) for n, m in model.named_modules() if isinstance(m, Linear)}
    assert methods.pop("lm_head") is not BlockLinearMethod  # the head keeps the model dtype
    assert set(methods.values()) == {BlockLinearMethod}
    from tokenmill.eval.kv_quality import chunked_scores
    a, _ = chunked_scores(ref.llm_engine, ids)
    b, _ = chunked_scores(q.llm_engine, ids)
    assert (a - b).abs().max() < 0.03 * (a.max() - a.min()) + 0.05
    out = q.generate([{"prompt_token_ids": ids[:4]}], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                     use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 6


def test_group_size_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="quant_group_size must be one of 32, 64, 128; got 48"):
        LLM(str(tiny_llama), quantization="int4", quant_group_size=48)
    with pytest.raises(ValueError, match="int4 weight quantization needs in_features divisible by 128, got 64"):
        LLM(str(tiny_llama), quantization="int4", quant_group_size=128, kv_cache_memory_gb=0.01)


@pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")
def test_default_model_int8_perplexity_within_one_percent():
    from tokenmill.data import read_text
    from tokenmill.eval.kv_quality import chunked_scores
    ppl = {}
    for name in ("none", "int8"):
        llm = LLM(None, dtype="float32", quantization=name, kv_cache_memory_gb=0.1)
        ids = llm.get_tokenizer().encode(read_text("alice_ch1_2.txt"))[:512]
        logp, _ = chunked_scores(llm.llm_engine, ids)
        ppl[name] = math.exp(-logp.mean().item())
    assert ppl["int8"] / ppl["none"] < 1.01, ppl
