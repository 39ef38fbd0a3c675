"""quantization="gguf": a .gguf model's Q4_0 / Q4_1 / Q8_0 blocks kept as they are.

Loading is checked exactly (every linear's packed records dequantize to the weights the float path
loads from the same file, Q/K un-permutation and fused shards included); computing is checked
against the dequantized model (perplexity on the shipped text within 0.75%: the int8 activation
rounding is the only difference; measured 0.49% on 1,024 tokens, docs/BENCHMARKS.md)."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize as gguf_quantize

from tokenmill import LLM, SamplingParams
from tokenmill.config import EngineConfig
from tokenmill.engine.resolve import resolve_quantization
from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear
from tokenmill.quant.blocks import BlockEmbedding, BlockLinearMethod, quantize_q8

from test_gguf_convert import _add_byte_level_vocab, _add_hparams, _finish

needs_kernels = pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")


def linears(model) -> dict[str, Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Linear)}


def assert_records_equal_float_weights(native, plain, requantized: tuple[str, ...] = ()) -> None:
    """Exact, except layers whose shards mixed 4- and 8-bit blocks (requantized to 8 bits: within
    half a step, max|w| / 254 per block)."""
    ours, theirs = linears(native), linears(plain)
    assert ours.keys() == theirs.keys()
    for name, layer in ours.items():
        w = torch.ops.tokenmill.q_dequantize(layer.records, layer.bits, layer.out_features, layer.in_features)
        ref = theirs[name].weight if theirs[name].weight.device.type != "meta" else None
        if ref is None:  # a packed float method freed its plain weight: unpack through a forward on I
            eye = torch.eye(layer.in_features)
            ref = (theirs[name](eye) - (0 if theirs[name].bias is None else theirs[name].bias)).T
        atol = ref.abs().max().item() / 254 if name in requantized else 1e-6
        torch.testing.assert_close(w, ref.float(), rtol=0, atol=atol, msg=name)


# -- a tiny Qwen2 GGUF with every kept block type, a fused layer mixing them, an untied head ------
def write_tiny_quantized_qwen2(path: Path) -> Path:
    hidden, ffn, heads, kv_heads, vocab = 64, 128, 4, 2, 259
    head_dim = hidden // heads
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.2

    writer = gguf.GGUFWriter(str(path), "qwen2")
    _add_hparams(writer, {"block_count": 2, "context_length": 128, "embedding_length": hidden,
                          "feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads})
    _add_byte_level_vocab(writer, vocab)
    quantized = {"attn_q": QT.Q4_0, "attn_k": QT.Q8_0, "attn_v": QT.Q4_1, "attn_output": QT.Q4_1,
                 "ffn_gate": QT.Q4_1, "ffn_up": QT.Q4_0, "ffn_down": QT.Q8_0}
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}

    def add(name: str, array: np.ndarray, qtype: QT | None = None) -> None:
        if qtype is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, gguf_quantize(array, qtype), raw_dtype=qtype)

    add("token_embd.weight", rand(vocab, hidden), QT.Q8_0)
    add("output.weight", rand(vocab, hidden), QT.Q4_1)
    add("output_norm.weight", 1 + rand(hidden))
    for i in range(2):
        add(f"blk.{i}.attn_norm.weight", 1 + rand(hidden))
        add(f"blk.{i}.ffn_norm.weight", 1 + rand(hidden))
        for short in ("attn_q", "attn_k", "attn_v"):
            add(f"blk.{i}.{short}.bias", rand(shapes[short][0]))
        for short, qtype in quantized.items():
            add(f"blk.{i}.{short}.weight", rand(*shapes[short]), qtype)
    _finish(writer)
    return path


@pytest.fixture(scope="module")
def tiny_gguf_file(tmp_path_factory) -> Path:
    return write_tiny_quantized_qwen2(tmp_path_factory.mktemp("qgguf") / "tiny-q.gguf")


@pytest.fixture
def tiny_gguf(tiny_gguf_file, monkeypatch) -> Path:
    """The tiny .gguf, its converted folder and index cached beside it (not in the user's cache)."""
    monkeypatch.setenv("TOKENMILL_CACHE", str(tiny_gguf_file.parent / "cache"))
    return tiny_gguf_file


@needs_kernels
def test_tiny_gguf_native_loads_the_same_weights(tiny_gguf):
    native = LLM(str(tiny_gguf), dtype="float32", kv_cache_memory_gb=0.01)
    plain = LLM(str(tiny_gguf), dtype="float32", quantization="none", kv_cache_memory_gb=0.01)
    n_model, p_model = native.llm_engine.runner.model, plain.llm_engine.runner.model
    assert native.llm_engine.config.model.quantization == "gguf"  # the default for a .gguf
    assert all(isinstance(m.quant_method, BlockLinearMethod) for m in linears(n_model).values())
    bits = {name: m.bits for name, m in linears(n_model).items()}
    assert bits["layers.0.self_attn.qkv_proj"] == 8  # Q4_0 + Q8_0 + Q4_1 shards: one 8-bit layer
    assert bits["layers.0.mlp.gate_up_proj"] == 4 and bits["layers.0.mlp.down_proj"] == 8
    assert bits["lm_head"] == 4
    assert isinstance(n_model.embed_tokens, BlockEmbedding)
    assert_records_equal_float_weights(n_model, p_model, requantized=("layers.0.self_attn.qkv_proj",
                                                                      "layers.1.self_attn.qkv_proj"))
    ids = torch.arange(3, 40)
    torch.testing.assert_close(n_model.embed_tokens(ids), p_model.embed_tokens(ids), rtol=0, atol=1e-6)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    out = native.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 8


def test_quantization_is_validated_and_resolved(tiny_llama):
    with pytest.raises(ValueError, match="quantization must be one of gguf, none, int8, int4, awq, gptq, compressed-tensors; got 'int3'"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="quantization='gguf'.*give a .gguf model"):
        LLM(str(tiny_llama), quantization="gguf")
    assert resolve_quantization(None, Path("m.gguf")) == "gguf"
    assert resolve_quantization(None, None) == "none"
    assert resolve_quantization("none", Path("m.gguf")) == "none"


def test_without_kernels_the_same_weights_run_dequantized(monkeypatch):
    """No C++ compiler: a block layer keeps its weights as float and uses F.linear."""
    monkeypatch.setattr(cpu_ops, "load", lambda: False)
    layer = Linear(64, [16, 8], quant_method=BlockLinearMethod())
    w = torch.randn(24, 64)
    layer.load_weight("weight", quantize_q8(w[:16]), 0)
    layer.load_weight("weight", quantize_q8(w[16:]), 1)
    layer.quant_method.load(layer)
    assert layer.records is None
    x = torch.randn(3, 64)
    expected = torch.cat([quantize_q8(w[:16]).dequantize(), quantize_q8(w[16:]).dequantize()])
    torch.testing.assert_close(layer(x), x @ expected.T)


def test_shards_must_cover_the_layer():
    layer = Linear(64, [16, 8], quant_method=BlockLinearMethod())
    layer.load_weight("weight", quantize_q8(torch.randn(16, 64)), 0)
    with pytest.raises(ValueError, match="do not cover rows 0..24"):
        layer.quant_method.load(layer)
    with pytest.raises(ValueError, match="checkpoint shape"):
        layer.load_weight("weight", quantize_q8(torch.randn(9, 64)), 1)


# -- the default model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_pair():
    native = LLM(None, dtype="float32", kv_cache_memory_gb=0.1)
    plain = LLM(None, dtype="float32", quantization="none", kv_cache_memory_gb=0.1)
    return native, plain


@needs_kernels
def test_default_model_keeps_its_q4_1_blocks(default_pair):
    native, plain = default_pair
    model = native.llm_engine.runner.model
    assert native.llm_engine.config.model.quantization == "gguf"
    layers = linears(model)
    assert all(m.bits == 4 for name, m in layers.items() if name != "lm_head")
    assert layers["lm_head"].bits == 8 and model.embed_tokens.records is layers["lm_head"].records  # tied
    record_bytes = sum(m.records.numel() for m in layers.values())
    assert record_bytes < 100e6  # Q4_1 layers + one Q8_0 table; float32 was 540 MB
    first = {k: v for k, v in layers.items() if k.startswith("layers.0.")}
    assert_records_equal_float_weights(_Sub(first), _Sub({k: linears(plain.llm_engine.runner.model)[k]
                                                          for k in first}))


class _Sub:
    """named_modules() over a chosen set of layers."""

    def __init__(self, layers: dict[str, Linear]) -> None:
        self.layers = layers

    def named_modules(self):
        return self.layers.items()


@needs_kernels
def test_default_model_perplexity_close_to_dequantized(default_pair):
    from tokenmill.data import read_text
    from tokenmill.eval.kv_quality import chunked_scores
    native, plain = default_pair
    ids = native.get_tokenizer().encode(read_text("alice_ch1_2.txt"))[:512]
    ppl = {}
    for name, llm in (("gguf", native), ("none", plain)):
        logp, _ = chunked_scores(llm.llm_engine, ids)
        ppl[name] = math.exp(-logp.mean().item())
    assert ppl["gguf"] / ppl["none"] < 1.0075, ppl


@needs_kernels
def test_weight_and_kv_quantization_combine(tiny_gguf):
    """GGUF blocks with an int8 KV cache: both quantizations in one engine."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompt = [{"prompt_token_ids": [5, 6, 7, 8, 9, 10]}]
    outs = {}
    for kv in ("auto", "int8"):
        llm = LLM(str(tiny_gguf), dtype="float32", kv_cache_dtype=kv, kv_cache_memory_gb=0.01)
        assert llm.llm_engine.config.model.quantization == "gguf"
        outs[kv] = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(outs["int8"]) == len(outs["auto"]) == 12


@needs_kernels
def test_greedy_head_on_blocks_gives_the_logits_tokens(tiny_gguf):
    """The 4-bit LM head's greedy tokens come from q_argmax_linear (no logits) unless logprobs are asked
    for (logits, then argmax): the same tokens either way."""
    llm = LLM(str(tiny_gguf), dtype="float32", kv_cache_memory_gb=0.01)
    model = llm.llm_engine.runner.model
    hidden = torch.randn(5, model.config.hidden_size)
    assert torch.equal(model.greedy_tokens(hidden, 64), model.compute_logits(hidden)[:, :64].argmax(-1))
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(3, 30))}]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    scored = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in llm.generate(prompts, scored, use_tqdm=False)]
