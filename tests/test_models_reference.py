"""Our model code against Hugging Face transformers on tiny random-weight models.

Tolerance: float32 logits within atol 1e-4 (both are float32 with the same math; differences are
summation order only). bfloat16: greedy next-token agreement >= 90% on random weights."""
import pytest
import torch
import transformers
from tiny_models import make_tiny_model

from tokenmill.engine.engine import LLMEngine

TOKENS = [3, 17, 250, 99, 4, 311, 42, 7, 128, 64, 500, 2, 19, 77, 301, 11, 200, 150, 90, 33]


@pytest.mark.parametrize("arch,overrides", [
    ("llama", {}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
               "rope_theta": 500000.0}),
    ("qwen2", {}),
    ("mistral", {"head_dim": 32}),
])
@pytest.mark.parametrize("kernels", ["on", "off"])
def test_logits_match_transformers(tmp_path, monkeypatch, arch, overrides, kernels):
    """kernels=off: the pure-PyTorch path (our C++ kernels disabled, as on a machine without a compiler)."""
    from tokenmill.kernels import cpu_ops
    if kernels == "off":
        monkeypatch.setattr(cpu_ops, "_state", {"ok": False})
    elif not cpu_ops.load():
        pytest.skip("C++ kernels unavailable here")
    folder = make_tiny_model(tmp_path, arch, seed=7, **overrides)
    engine = LLMEngine(model=str(folder), dtype="float32", kv_cache_memory_gb=0.01, block_size=4)
    ours = engine.runner.full_logits(TOKENS)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        ref = ref_model(torch.tensor([TOKENS])).logits[0]
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_bfloat16_close_to_float32(tiny_llama):
    f32 = LLMEngine(model=str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01).runner.full_logits(TOKENS)
    bf16 = LLMEngine(model=str(tiny_llama), dtype="bfloat16", kv_cache_memory_gb=0.01).runner.full_logits(TOKENS)
    agree = (f32.argmax(-1) == bf16.argmax(-1)).float().mean().item()
    assert agree >= 0.9
    assert (f32 - bf16).abs().max().item() < 0.1 * f32.abs().max().item()


def test_unsupported_architecture_is_named(tmp_path):
    import json
    folder = make_tiny_model(tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'; supported: .*LlamaForCausalLM.*Qwen3ForCausalLM"):
        LLMEngine(model=str(folder))


def test_unknown_path():
    with pytest.raises(ValueError, match="model path does not exist"):
        LLMEngine(model="/nonexistent/model")
