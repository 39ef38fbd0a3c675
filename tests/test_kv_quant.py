"""Quantized KV cache (kv_cache_dtype int8 / fp8): storage math, memory accounting, both attention
backends, and a quality bound on the real model; and a plain bf16 cache under a float32 model
(kv_cache_dtype bfloat16).

Accepted quality bounds (SmolLM2-135M-Instruct, float32, first 512 tokens of
tokenmill/data/alice_ch1_2.txt, scored through the paged cache in chunks of 120 tokens, so chunk
boundaries fall mid-block):
  int8: perplexity within +2% of auto, teacher-forced top-1 agreement >= 0.95
  fp8:  perplexity within +5% of auto, teacher-forced top-1 agreement >= 0.90
Greedy: the mean fraction of 12 tokens before the first divergence from auto, 2 prompts: int8 >= 0.5,
fp8 >= 0.25 (loose: free-running greedy decoding amplifies any difference).
Measured 2026-11-29: int8 +0.22% / 0.980 / greedy 1.0, fp8 +1.14% / 0.957 / greedy 0.83."""
import math

import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.attention.kv_cache import QuantizedKVCacheSpec, gather_blocks, gather_slots, make_kv_cache_spec, write_kv
from tokenmill.models.model_config import load_model_config
from tokenmill.models.llama import LlamaForCausalLM


def kv_cache_spec(cfg, kvd, dt, bs):
    return LlamaForCausalLM.kv_cache_spec(cfg, kvd, dt, bs)


def num_kv_blocks_for_budget(cfg, kvd, dt, bs, budget):
    return int(budget // (LlamaForCausalLM.kv_bytes_per_token(cfg, kvd, dt, bs) * bs))

BS, HKV, D = 16, 3, 64  # SmolLM2-135M: 30 layers, 3 KV heads, head dim 64
HALF_GIB = 1 << 29


# -- bytes and blocks -------------------------------------------------------------------------------
def test_bytes_per_token_smollm2(smollm2_folder):
    cfg = load_model_config(smollm2_folder)
    per_token = {name: kv_cache_spec(cfg, kvd, dt, BS).bytes_per_token * cfg.num_layers
                 for name, kvd, dt in [("fp32", "auto", torch.float32), ("bf16", "auto", torch.bfloat16),
                                       ("int8", "int8", torch.float32), ("fp8", "fp8", torch.float32),
                                       ("bf16_under_fp32", "bfloat16", torch.float32)]}
    assert per_token["fp32"] == 46_080 and per_token["bf16"] == 23_040  # 30 x 2 x 3 x 64 x (4 | 2)
    assert per_token["bf16_under_fp32"] == 23_040
    # 1 byte per element + a 1-byte scale code per (token, KV head), for K and for V:
    # 30 x 2 x 3 x (64 + 1) = 11,700 bytes = 65/128 = 50.8% of bf16
    assert per_token["int8"] == per_token["fp8"] == 30 * 2 * 3 * (64 + 1) == 11_700
    fp32_scales = make_kv_cache_spec("int8", torch.float32, BS, HKV, D, scale_format="fp32")
    assert fp32_scales.bytes_per_token * 30 == 30 * 2 * 3 * (64 + 4)


def test_same_budget_doubles_blocks_vs_bf16_minus_scales(smollm2_folder):
    cfg = load_model_config(smollm2_folder)
    blocks = {kvd: num_kv_blocks_for_budget(cfg, kvd, dt, BS, HALF_GIB)
              for kvd, dt in [("auto", torch.bfloat16), ("int8", torch.float32), ("fp8", torch.float32)]}
    scale_overhead = (D + 1) / D  # 65/64: what the scale codes cost on top of exactly half
    assert blocks["auto"] == 1456
    for kvd in ("int8", "fp8"):
        assert blocks[kvd] == 2867  # 1.969x
        assert blocks[kvd] >= math.floor(2 * blocks["auto"] / scale_overhead)
        assert blocks[kvd] * kv_cache_spec(cfg, kvd, torch.float32, BS).bytes_per_block * 30 <= HALF_GIB


def test_engine_admits_twice_the_sequences_of_bf16(tiny_llama):
    """Same kv_cache_memory_gb: count the sequences the scheduler admits at once (tiny model: 2 layers,
    2 KV heads, head dim 16, so a 1-byte scale per 16 values costs 1/16 = 6% extra: 1.88x here)."""
    admitted = {}
    for kvd in ("auto", "int8"):
        llm = LLM(str(tiny_llama), dtype="bfloat16", kv_cache_dtype=kvd, kv_cache_memory_gb=0.0005,
                  enable_prefix_caching=False, max_num_seqs=512, max_num_batched_tokens=16384)
        engine = llm.llm_engine
        for i in range(300):
            engine.add_request(f"r{i}", {"prompt_token_ids": [3 + (i + j) % 400 for j in range(32)]},
                               SamplingParams(max_tokens=1, temperature=0))
        engine.step()  # admission only depends on free blocks: 2 blocks per 32-token prompt
        admitted[kvd] = (engine.config.cache.num_blocks, 300 - engine.num_waiting_requests())
        for i in range(300):
            engine.abort_request(f"r{i}")
    (blocks_bf16, seqs_bf16), (blocks_int8, seqs_int8) = admitted["auto"], admitted["int8"]
    overhead = (16 + 1) / 16
    assert blocks_int8 >= math.floor(2 * blocks_bf16 / overhead)
    assert seqs_int8 >= math.floor(2 * seqs_bf16 / overhead) - 2, admitted  # watermark rounding


# -- storage math ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_format", ["log8", "fp32"])
@pytest.mark.parametrize("kvd", ["int8", "fp8"])
def test_write_then_gather_error_bounds(kvd, scale_format):
    torch.manual_seed(0)
    spec = make_kv_cache_spec(kvd, torch.float32, BS, HKV, D, num_blocks=4, scale_format=scale_format)
    assert isinstance(spec, QuantizedKVCacheSpec)
    cache = spec.allocate()
    scale_dtype = torch.int8 if scale_format == "log8" else torch.float32
    assert [t.dtype for t in cache] == [spec.dtype, spec.dtype, scale_dtype, scale_dtype]
    x = torch.randn(2 * BS, HKV, D) * torch.exp(2 * torch.randn(2 * BS, HKV, 1))  # magnitudes vary a lot
    write_kv(cache, x[:BS], -x[:BS], torch.arange(BS, 2 * BS))  # block 1 at once
    for i in range(BS):  # block 2 one token at a time, like decode
        write_kv(cache, x[BS + i:BS + i + 1], -x[BS + i:BS + i + 1], torch.tensor([2 * BS + i]))
    k, v = gather_blocks(cache, torch.tensor([[1, 2]]), BS, torch.float32)
    k2, v2 = gather_slots(cache, torch.arange(BS, 3 * BS))
    assert torch.equal(k[0], k2) and torch.equal(v[0], v2) and torch.equal(v[0], -k[0])
    amax = x.abs().amax(-1, keepdim=True)  # per (token, head)
    code_slack = 2 ** (1 / 8) if scale_format == "log8" else 1.0  # the log8 code rounds the scale up
    err = (k[0] - x).abs()
    if kvd == "int8":  # one rounding, on a grid of scale <= amax / 127 * 2^(1/8)
        assert (err <= amax / 127 * code_slack / 2 * 1.0001).all()
    else:  # e4m3: 3 mantissa bits, <= 2^-4 relative; subnormals below 2^-6 of the scale
        assert (err <= x.abs() * 2 ** -4 + amax / 448 * code_slack * 2 ** -10 * 1.0001).all()


def test_unknown_kv_dtype_and_scale_format():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, bfloat16, int8, fp8"):
        make_kv_cache_spec("int4", torch.float32, BS, HKV, D)
    with pytest.raises(ValueError, match="scale_format must be one of log8, fp32"):
        make_kv_cache_spec("int8", torch.float32, BS, HKV, D, scale_format="bf16")


@pytest.mark.parametrize("kvd", ["int8", "fp8"])
def test_reference_and_torch_backends_agree_on_quantized_cache(tiny_llama, kvd):
    from tokenmill.eval.kv_quality import chunked_scores
    tokens = [3 + (i * 37) % 500 for i in range(70)]
    scores = {}
    for backend in ("torch", "reference"):
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_dtype=kvd, num_kv_blocks=64,
                  attention_backend=backend)
        scores[backend] = chunked_scores(llm.llm_engine, tokens, chunk=9)[0]
        out = llm.generate([{"prompt_token_ids": tokens[:20]}, {"prompt_token_ids": tokens[30:41]}],
                           SamplingParams(max_tokens=10, temperature=0, ignore_eos=True), use_tqdm=False)
        scores[backend + "_gen"] = [o.outputs[0].token_ids for o in out]
    torch.testing.assert_close(scores["torch"], scores["reference"], atol=1e-4, rtol=1e-4)
    assert scores["torch_gen"] == scores["reference_gen"]


# -- a bf16 cache under a float32 model ---------------------------------------------------------------
def test_bf16_cache_under_float32_model_every_backend(tiny_llama):
    """kv_cache_dtype bfloat16 with float32 weights and activations: the cache holds bf16 (half the
    bytes of auto), every backend scores the same (1e-4: they differ only in summation order over the
    same bf16 K/V), within bf16 rounding of the float32 cache (2e-3 in log-probability; 3.5e-4
    measured on this random tiny model), and neither the chunking nor prefix caching changes a
    result: this step's float32 rows are rounded as they are stored, so a fresh prompt attends to what
    the cache holds (attending to the unrounded rows moves the one-chunk scores by 2.3e-4)."""
    from tokenmill.eval.kv_quality import chunked_scores
    tokens = [3 + (i * 37) % 500 for i in range(70)]
    prompts = [{"prompt_token_ids": tokens[:40]}, {"prompt_token_ids": tokens[:40] + tokens[50:60]}]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    scores, gens = {}, {}
    for backend, kvd, caching in [("cpu", "auto", True), ("cpu", "bfloat16", True), ("cpu", "bfloat16", False),
                                  ("torch", "bfloat16", True), ("reference", "bfloat16", True)]:
        llm = LLM(str(tiny_llama), dtype="float32", kv_cache_dtype=kvd, num_kv_blocks=64, block_size=16,
                  attention_backend=backend, enable_prefix_caching=caching)
        runner = llm.llm_engine.runner
        assert runner.kv_caches[0][0].dtype == (torch.bfloat16 if kvd == "bfloat16" else torch.float32)
        scores[backend, kvd] = chunked_scores(llm.llm_engine, tokens, chunk=9)[0]
        if backend == "cpu":  # one chunk: every key fresh in this step
            torch.testing.assert_close(chunked_scores(llm.llm_engine, tokens, chunk=70)[0], scores[backend, kvd],
                                       atol=1e-5, rtol=0)
        gens[backend, kvd, caching] = [[o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
                                       for _ in range(2)]  # the second pass hits the prefix cache if on
        assert llm.llm_engine.core.kv.pool.num_used_blocks == 0
    for backend in ("torch", "reference"):
        torch.testing.assert_close(scores[backend, "bfloat16"], scores["cpu", "bfloat16"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scores["cpu", "bfloat16"], scores["cpu", "auto"], atol=2e-3, rtol=0)
    assert not torch.equal(scores["cpu", "bfloat16"], scores["cpu", "auto"])  # the cache really is bf16
    with_cache, without = gens["cpu", "bfloat16", True], gens["cpu", "bfloat16", False]
    assert with_cache[0] == with_cache[1] == without[0] == without[1]


# -- quality on the real model -----------------------------------------------------------------------
def test_quality_bounds_smollm2(smollm2_folder):
    from tokenmill.eval.kv_quality import default_variants, evaluate
    llm = LLM(str(smollm2_folder), dtype="float32", num_kv_blocks=48)
    report = evaluate(llm=llm, variants=default_variants(), num_tokens=512, num_prompts=2, gen_tokens=12,
                      chunk=120, log=lambda s: None)
    auto, int8, fp8 = report.results
    assert auto.top1_agreement == 1.0 and 10 < auto.ppl < 40
    assert int8.ppl <= auto.ppl * 1.02 and int8.top1_agreement >= 0.95, (int8.ppl, int8.top1_agreement)
    assert fp8.ppl <= auto.ppl * 1.05 and fp8.top1_agreement >= 0.90, (fp8.ppl, fp8.top1_agreement)
    # short greedy generations through the decode path (quantized writes one token at a time)
    assert int8.prefix_agreement >= 0.5 and fp8.prefix_agreement >= 0.25, (int8.outputs, auto.outputs)
    assert llm.llm_engine.core.kv.pool.num_used_blocks == 0
