"""GGUF checkpoints of the newer families (qwen3, qwen3moe) convert to folders that transformers
reads as it reads the GGUF itself (same tensors, same logits), and our engine matches them; MoE and
MLA families (Mixtral, Qwen2-MoE, DeepSeek-V2/V3) written in llama.cpp's layout
(tests/llamacpp_gguf.py) load as the HF models they were written from."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from test_gguf_convert import (_add_byte_level_vocab, _add_hparams, _assert_same_weights_and_logits, _finish,
                               _load_folder_model, _load_gguf_model)

from tokenmill.engine.engine import LLMEngine
from tokenmill.models.gguf_convert import gguf_to_hf_folder


def _write_tiny(path: Path, arch: str) -> Path:
    # head_dim 128: transformers' GGUF loader ignores attention.key_length for qwen3 (takes the default)
    hidden, ffn, heads, kv_heads, head_dim, vocab, experts = 16, 32, 4, 2, 128, 259, 4
    if arch == "qwen3moe":
        ffn = 768  # ... and expert_feed_forward_length (takes 768)
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.2

    writer = gguf.GGUFWriter(str(path), arch)
    _add_hparams(writer, {"block_count": 2, "context_length": 64, "embedding_length": hidden,
                          "feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads})
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch == "qwen3moe":
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
        writer.add_expert_feed_forward_length(ffn)
    _add_byte_level_vocab(writer, vocab)
    tensors = {"token_embd.weight": rand(vocab, hidden), "output.weight": rand(vocab, hidden),
               "output_norm.weight": 1 + rand(hidden)}
    for i in range(2):
        b = f"blk.{i}."
        tensors.update({
            b + "attn_norm.weight": 1 + rand(hidden), b + "ffn_norm.weight": 1 + rand(hidden),
            b + "attn_q.weight": rand(heads * head_dim, hidden), b + "attn_k.weight": rand(kv_heads * head_dim, hidden),
            b + "attn_v.weight": rand(kv_heads * head_dim, hidden), b + "attn_output.weight": rand(hidden, heads * head_dim),
            b + "attn_q_norm.weight": 1 + rand(head_dim), b + "attn_k_norm.weight": 1 + rand(head_dim)})
        if arch == "qwen3moe":
            tensors.update({b + "ffn_gate_inp.weight": rand(experts, hidden) * 5,
                            b + "ffn_gate_exps.weight": rand(experts, ffn, hidden),
                            b + "ffn_up_exps.weight": rand(experts, ffn, hidden),
                            b + "ffn_down_exps.weight": rand(experts, hidden, ffn)})
        else:
            tensors.update({b + "ffn_gate.weight": rand(ffn, hidden), b + "ffn_up.weight": rand(ffn, hidden),
                            b + "ffn_down.weight": rand(hidden, ffn)})
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    _finish(writer)
    return path


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_gguf_converts_and_our_engine_matches(tmp_path, arch, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))  # the engine's conversion too
    path = _write_tiny(tmp_path / f"tiny-{arch}.gguf", arch)
    folder = gguf_to_hf_folder(path)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
    reference = _load_gguf_model(path)
    _assert_same_weights_and_logits(_load_folder_model(folder), reference, ids)
    ours = LLMEngine(model=str(path), dtype="float32", num_kv_blocks=16, block_size=4).runner.full_logits(ids[0].tolist())
    with torch.no_grad():
        torch.testing.assert_close(ours, reference(ids).logits[0], atol=1e-4, rtol=1e-4)


# -- MoE / MLA GGUFs in llama.cpp's layout, against transformers on the original HF model ----------
# Tolerance: float32 logits within atol/rtol 1e-4 (the same weights; summation order differs).
MOE_ARCHS = {  # tiny_models arch, how llama.cpp lays it out
    "mixtral": ("mixtral", {}),  # llama + experts: Q/K rows permuted, ffn_*_exps stacked
    "mixtral_legacy_experts": ("mixtral", {"experts": "legacy"}),  # ffn_gate.{e} ... (pre-2024 files)
    "qwen2_moe": ("qwen2_moe", {"experts": "gate_up"}),  # shared expert + its sigmoid gate; ffn_gate_up_exps
    "deepseek_v2": ("deepseek_v2", {"split_kv_b": False}),  # softmax router, groups; older one-piece attn_kv_b
    # sigmoid router + exp_probs_b (no expert_gating_func key: a config.json without scoring_func, as
    # transformers writes); attn_k_b / attn_v_b
    "deepseek_v3": ("deepseek_v3", {}),
    # YaRN as llama.cpp keeps it (yarn_log_multiplier = 0.1 * mscale_all_dim; mscale == mscale_all_dim);
    # expert_gating_func = 2 (sigmoid) written
    "deepseek_v3_yarn": ("deepseek_v3", {}, {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}, "scoring_func": "sigmoid"}),
}


@pytest.fixture(scope="module")
def moe_ggufs(tmp_path_factory):
    from llamacpp_gguf import write_llamacpp_gguf
    from tiny_models import make_tiny_model

    out = {}
    for name, (arch, layout, *hf) in MOE_ARCHS.items():
        folder = make_tiny_model(tmp_path_factory.mktemp(name), arch, seed=11, **(hf[0] if hf else {}))
        out[name] = folder, write_llamacpp_gguf(folder, folder / f"tiny-{name}.gguf", **layout)
    return out


@pytest.mark.parametrize("name", list(MOE_ARCHS))
def test_moe_gguf_in_llamacpp_layout_matches_transformers(moe_ggufs, tmp_path, monkeypatch, name):
    """Logits within 1e-4 and 32 greedy tokens identical to transformers on the HF model the GGUF
    was written from (prompts batched, chunked prefill, prefix caching, preemption); float path
    (quantization="none": the converted folder). The default quantization="gguf" path reads the
    same tensors from the file (it stores the float32 embedding table as 8-bit blocks, hence the
    looser bound there: logits within 2% of their range)."""
    import transformers
    from test_models_breadth import TOKENS, _hf_greedy, _prompts

    from tokenmill import LLM, SamplingParams

    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    folder, path = moe_ggufs[name]
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    llm = LLM(str(path), dtype="float32", quantization="none", block_size=4, num_kv_blocks=30,
              max_num_batched_tokens=16)
    engine = llm.llm_engine
    assert engine.config.model.arch.architecture == json.loads((folder / "config.json").read_text())["architectures"][0]
    with torch.no_grad():
        expected = ref(torch.tensor([TOKENS])).logits[0]
    torch.testing.assert_close(engine.runner.full_logits(TOKENS), expected, atol=1e-4, rtol=1e-4)
    blocks = LLMEngine(model=str(path), dtype="float32", num_kv_blocks=32, block_size=4).runner.full_logits(TOKENS)
    assert (blocks - expected).abs().max() < 0.02 * (expected.max() - expected.min())
    prompts = _prompts()[:4]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=32, temperature=0, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [_hf_greedy(ref, p, 32) for p in prompts]
    assert engine.core.scheduler.num_preemptions > 0 and engine.core.prefix_stats.hits > 0


def test_quantized_moe_experts_load_and_stay_blocks(tmp_path, monkeypatch):
    """Mixtral with Q8_0 / Q4_0 stacked experts and a Q8_0 (row-permuted) attn_q: the float path
    matches transformers on the same weights after a Q8_0 / Q4_0 round trip (1e-4); the default
    gguf path keeps each expert's rows as blocks that dequantize exactly to those weights."""
    import shutil

    import transformers
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize, quantize
    from llamacpp_gguf import write_llamacpp_gguf
    from safetensors.torch import load_file, save_file
    from test_models_breadth import TOKENS
    from tiny_models import make_tiny_model

    from tokenmill import LLM

    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    folder = make_tiny_model(tmp_path / "hf", "mixtral", seed=5)
    types = {"ffn_gate_exps": QT.Q8_0, "ffn_up_exps": QT.Q8_0, "ffn_down_exps": QT.Q4_0, "attn_q": QT.Q8_0}
    path = write_llamacpp_gguf(folder, tmp_path / "tiny-mixtral-q.gguf", quantize=types)
    hf_types = {".w1.": QT.Q8_0, ".w3.": QT.Q8_0, ".w2.": QT.Q4_0, ".q_proj.": QT.Q8_0}
    ref_folder = shutil.copytree(folder, tmp_path / "hf-roundtrip")
    weights = load_file(str(folder / "model.safetensors"))
    for name, w in weights.items():
        if (qtype := next((t for key, t in hf_types.items() if key in name), None)) is not None:
            weights[name] = torch.from_numpy(dequantize(quantize(w.numpy(), qtype), qtype).copy())
    save_file(weights, str(ref_folder / "model.safetensors"), metadata={"format": "pt"})
    ref = transformers.AutoModelForCausalLM.from_pretrained(ref_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = ref(torch.tensor([TOKENS])).logits[0]

    plain = LLM(str(path), dtype="float32", quantization="none", num_kv_blocks=32, block_size=4)
    torch.testing.assert_close(plain.llm_engine.runner.full_logits(TOKENS), expected, atol=1e-4, rtol=1e-4)
    native = LLM(str(path), dtype="float32", num_kv_blocks=32, block_size=4)
    n_model, p_model = native.llm_engine.runner.model, plain.llm_engine.runner.model
    n_layers, p_layers = dict(n_model.named_modules()), dict(p_model.named_modules())
    experts = [n for n in n_layers if ".experts." in n and n.endswith(("gate_up_proj", "down_proj"))]
    assert len(experts) == 2 * 8 * 2
    for name in experts:
        layer = n_layers[name]
        assert layer.bits == (4 if name.endswith("down_proj") else 8), name
        w = torch.ops.tokenmill.q_dequantize(layer.records, layer.bits, layer.out_features, layer.in_features)
        dense = p_layers[name](torch.eye(layer.in_features)).T  # the float path's weight, through its own GEMM
        torch.testing.assert_close(w, dense, rtol=0, atol=1e-6, msg=name)
    blocks = native.llm_engine.runner.full_logits(TOKENS)
    assert (blocks - expected).abs().max() < 0.02 * (expected.max() - expected.min())


def test_unsupported_gguf_architecture_names_the_supported_ones(tmp_path):
    path = tmp_path / "gemma.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    _finish(writer)
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gemma2'.*llama, qwen2, qwen3, qwen3moe, "
                                         r"qwen2moe, deepseek2"):
        LLMEngine(model=str(path), dtype="float32", num_kv_blocks=4)


def test_missing_gguf_key_is_named():
    from tokenmill.models.gguf_arch import build_hf_config

    meta = {"deepseek2.embedding_length": 64, "deepseek2.attention.head_count": 4, "deepseek2.block_count": 2,
            "deepseek2.feed_forward_length": 128, "deepseek2.expert_count": 8, "deepseek2.expert_used_count": 2,
            "deepseek2.expert_feed_forward_length": 32}
    shapes = {"token_embd.weight": [64, 512], "blk.0.attn_q.weight": [64, 96]}
    with pytest.raises(ValueError, match=r"no deepseek2.rope.dimension_count \(required for architecture 'deepseek2'\)"):
        build_hf_config("deepseek2", meta, shapes)
    meta["deepseek2.rope.dimension_count"] = 8
    with pytest.raises(ValueError, match=r"no deepseek2.attention.key_length "):
        build_hf_config("deepseek2", meta, shapes)
