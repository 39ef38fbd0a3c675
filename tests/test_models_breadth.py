"""Qwen3, sliding-window attention, MoE (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) and MLA against
Hugging Face transformers on tiny random-weight models (hidden 64, 2 layers, vocab 512).

Tolerance: float32 logits within atol/rtol 1e-4 (same math, summation order differs). Greedy
decoding: token-identical to transformers' own cached greedy loop for 32 steps, with our engine
running the prompts together under chunked prefill, prefix caching and preemption."""
import random

import pytest
import torch
import transformers
from tiny_models import make_tiny_model

from tokenmill import LLM, SamplingParams
from tokenmill.engine.engine import LLMEngine

TOKENS = [3, 17, 250, 99, 4, 311, 42, 7, 128, 64, 500, 2, 19, 77, 301, 11, 200, 150, 90, 33] * 2

ARCHS = {
    "qwen3": ("qwen3", {}),
    # Qwen3 with a window on layer 1 only (max_window_layers=1): per-layer windows
    "qwen3_window": ("qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1}),
    "mistral_window": ("mistral", {"sliding_window": 8}),
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen3_moe": ("qwen3_moe", {}),
    "deepseek_v2": ("deepseek_v2", {}),
    "deepseek_v3": ("deepseek_v3", {}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: make_tiny_model(tmp_path_factory.mktemp(name), arch, seed=7, **ov)
            for name, (arch, ov) in ARCHS.items()}


@pytest.fixture(scope="module")
def references(folders):
    return {name: transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            for name, folder in folders.items()}


# the torch backend only where attention differs from the dense models' (windows, MLA)
@pytest.mark.parametrize("name,backend", [(name, "cpu") for name in ARCHS] + [
    ("qwen3_window", "torch"), ("mistral_window", "torch"), ("deepseek_v2", "torch"), ("deepseek_v3", "reference")])
def test_logits_match_transformers(folders, references, name, backend):
    from tokenmill.kernels import cpu_ops
    if backend == "cpu" and not cpu_ops.load():
        pytest.skip("C++ kernels unavailable here")
    engine = LLMEngine(model=str(folders[name]), dtype="float32", num_kv_blocks=64, block_size=4,
                       attention_backend=backend)
    ours = engine.runner.full_logits(TOKENS)
    with torch.no_grad():
        ref = references[name](torch.tensor([TOKENS])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_yarn_rope_matches_transformers(tmp_path, arch):
    """DeepSeek's long-context checkpoints use YaRN (and its mscale_all_dim scales the softmax)."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0}
    folder = make_tiny_model(tmp_path, arch, seed=9, rope_parameters=yarn)
    ours = LLMEngine(model=str(folder), dtype="float32", num_kv_blocks=64, block_size=4).runner.full_logits(TOKENS)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(torch.tensor([TOKENS])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def _hf_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """transformers' own KV cache, one argmax per step (EOS not special)."""
    out, tokens = [], torch.tensor([prompt])
    cache = None
    with torch.no_grad():
        for _ in range(steps):
            res = model(tokens, past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            tokens = torch.tensor([[nxt]])
    return out


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    shared = [rng.randrange(3, 500) for _ in range(12)]  # a common prefix: prefix-cache hits
    return [shared + [rng.randrange(3, 500) for _ in range(rng.randint(2, 18))] for _ in range(6)]


@pytest.mark.parametrize("name", list(ARCHS))
def test_greedy_32_steps_identical_under_batching_chunking_prefix_caching_and_preemption(folders, references, name):
    prompts = _prompts()
    expected = [_hf_greedy(references[name], p, 32) for p in prompts]
    # 4-token blocks, 30 of them: far less than 6 requests of up to 62 tokens need at once (with an
    # 8-token window in every layer a request holds at most 8 blocks at once, so 10 blocks)
    blocks = 10 if name == "mistral_window" else 30
    llm = LLM(str(folders[name]), dtype="float32", block_size=4, num_kv_blocks=blocks, max_num_batched_tokens=16)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in first + rest]
    assert got == expected
    assert engine.core.scheduler.num_preemptions > 0
    assert engine.core.prefix_stats.hits > 0
    assert engine.core.kv.pool.num_free_blocks == engine.config.cache.num_blocks  # nothing leaked


def test_window_binds(folders, references):
    """The windowed model's logits differ from the same weights without the window (so the tests
    above really exercise it), and ours match transformers' in both cases."""
    import json
    folder = folders["mistral_window"]
    with torch.no_grad():
        windowed = references["mistral_window"](torch.tensor([TOKENS])).logits[0]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["sliding_window"] == 8
    full = LLMEngine(model=str(folder), dtype="float32", num_kv_blocks=64, block_size=4)
    full_logits = full.runner.full_logits(TOKENS)
    assert full.config.cache.sliding_window == 8
    assert (full_logits[10:] - windowed[10:]).abs().max() < 1e-4  # ours honours it
    no_window = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, sliding_window=None)
    with torch.no_grad():
        unwindowed = no_window(torch.tensor([TOKENS])).logits[0]
    assert (unwindowed[10:] - windowed[10:]).abs().max() > 1e-2


def test_blocks_behind_the_window_go_back_to_the_pool(folders):
    """Every layer slides (window 8, 4-token blocks): a long request holds only the blocks its
    future tokens can still see, whatever its length."""
    llm = LLM(str(folders["mistral_window"]), dtype="float32", block_size=4, num_kv_blocks=64,
              max_num_batched_tokens=8, enable_prefix_caching=False)
    engine = llm.llm_engine
    engine.add_request("long", {"prompt_token_ids": list(range(3, 43))},
                       SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    held = []
    while engine.has_unfinished_requests():
        engine.step()
        blocks = engine.core.kv.req_blocks.get("long", [])
        held.append(sum(b.block_id >= 0 for b in blocks))
    # window 8 + a chunk of 8 new tokens span at most 5 blocks of 4 (+1 partly filled)
    assert max(held) <= 5
    assert engine.core.kv.pool.num_free_blocks == 64


def test_mla_caches_the_latent(folders):
    """KV bytes per token: (kv_lora_rank + qk_rope_head_dim) per layer, vs heads x (qk + v) dims."""
    from tokenmill.models.deepseek import DeepseekV3ForCausalLM
    engine = LLMEngine(model=str(folders["deepseek_v3"]), dtype="float32", num_kv_blocks=16, block_size=4)
    arch = engine.config.model.arch
    assert engine.config.cache.bytes_per_token == 2 * (32 + 8) * 4
    decompressed = type("Decompressed", (DeepseekV3ForCausalLM,), {"decompressed_cache": True})
    assert decompressed.kv_bytes_per_token(arch, "auto", torch.float32, 4) == 2 * 4 * (24 + 16) * 4
    with pytest.raises(ValueError, match="kv_cache_dtype='int8' is not supported for MLA"):
        LLMEngine(model=str(folders["deepseek_v3"]), dtype="float32", num_kv_blocks=16, kv_cache_dtype="int8")


def test_mla_decompressed_cache_gives_the_same_tokens(folders, references):
    """The benchmark's baseline (per-head K/V cached, no absorption) decodes the same tokens."""
    from tokenmill.models.deepseek import DeepseekV2ForCausalLM
    from tokenmill.models.registry import _registered, register_model
    prompts = _prompts()[:3]
    expected = [_hf_greedy(references["deepseek_v2"], p, 12) for p in prompts]
    register_model("DeepseekV2ForCausalLM", type("Decompressed", (DeepseekV2ForCausalLM,), {"decompressed_cache": True}))
    try:
        llm = LLM(str(folders["deepseek_v2"]), dtype="float32", block_size=4, num_kv_blocks=64)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), use_tqdm=False)
    finally:
        _registered.pop("DeepseekV2ForCausalLM")
    assert [o.outputs[0].token_ids for o in outs] == expected


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3", "mistral_window"])
def test_bfloat16_close_to_float32_and_decodes(folders, name):
    """bf16 weights and KV cache (float32 activations): greedy next-token agreement >= 90% with
    float32 on random weights, logits within 10% of their range; decoding runs (absorbed MLA and
    windowed decode on a bf16 cache)."""
    f32 = LLMEngine(model=str(folders[name]), dtype="float32", num_kv_blocks=64, block_size=4).runner.full_logits(TOKENS)
    llm = LLM(str(folders[name]), dtype="bfloat16", num_kv_blocks=64, block_size=4)
    bf16 = llm.llm_engine.runner.full_logits(TOKENS)
    assert (f32.argmax(-1) == bf16.argmax(-1)).float().mean().item() >= 0.9
    assert (f32 - bf16).abs().max().item() < 0.1 * f32.abs().max().item()
    outs = llm.generate([{"prompt_token_ids": TOKENS[:20]}, {"prompt_token_ids": TOKENS[5:9]}],
                        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [24, 24]
