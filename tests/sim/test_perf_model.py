"""Model shapes from config.json and the roofline performance model (pure arithmetic: exact)."""
import pytest

from tokenmill.sim.hardware import get_hardware, load_hardware, load_profile, profile_perf_model
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import BatchShape, PerfCoefficients, PerfModel

LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
             "tie_word_embeddings": False}
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
                "num_local_experts": 8, "num_experts_per_tok": 2}
DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
                    "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "num_hidden_layers": 27, "vocab_size": 102400, "n_routed_experts": 64, "n_shared_experts": 2,
                    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}


def test_default_model_shape_matches_design_numbers(smollm2_folder):
    s = ModelShape.from_folder(smollm2_folder)
    assert s.kv_bytes_per_token("bfloat16") == 30 * 2 * 3 * 64 * 2 == 23040
    assert s.num_params == pytest.approx(134.5e6, rel=0.01)  # SmolLM2-135M
    assert s.linear_flops_per_token == pytest.approx(0.27e9, rel=0.01)


def test_published_parameter_counts():
    """Llama-3-8B 8.03B; Mixtral-8x7B 46.7B total, 12.9B active; DeepSeek-V2-Lite 15.7B (2.4B active)."""
    llama = ModelShape.from_hf_config(LLAMA3_8B)
    assert llama.num_params == pytest.approx(8.03e9, rel=0.01)
    assert llama.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    mixtral = ModelShape.from_hf_config(MIXTRAL_8X7B)
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.num_active_params == pytest.approx(12.9e9, rel=0.03)
    ds = ModelShape.from_hf_config(DEEPSEEK_V2_LITE)
    assert ds.is_mla and ds.is_moe
    assert ds.kv_bytes_per_token("bfloat16") == 27 * (512 + 64) * 2  # the latent, not per-head K/V
    assert ds.num_params == pytest.approx(15.7e9, rel=0.05)
    assert ds.num_active_params == pytest.approx(2.4e9, rel=0.15)


def test_missing_field_is_named():
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelShape.from_hf_config({k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"})


def _model(**kw):
    coeff = PerfCoefficients(linear_flops_per_s=1e12, attention_flops_per_s=1e12, mem_bytes_per_s=1e12,
                             step_overhead_s=0.001, per_seq_s=1e-5)
    return PerfModel(ModelShape.from_hf_config(LLAMA3_8B), coeff, **kw)


def test_decode_is_weight_bound_and_prefill_compute_bound():
    m = _model()
    decode = m.breakdown(BatchShape(num_decode_tokens=1, num_seqs=1, attention_pairs=100, kv_tokens_read=100))
    assert decode["weight_read"] == pytest.approx(m.weight_bytes / 1e12) and decode["linear_compute"] == 0
    prefill = m.breakdown(BatchShape(num_prefill_tokens=2048, num_seqs=1, attention_pairs=2048 * 2049 // 2,
                                     kv_tokens_read=2048))
    assert prefill["linear_compute"] == pytest.approx(2048 * m.shape.linear_flops_per_token / 1e12)
    assert prefill["weight_read"] == 0
    assert m.step_time(BatchShape(num_prefill_tokens=2048, num_seqs=1)) == pytest.approx(
        sum(m.breakdown(BatchShape(num_prefill_tokens=2048, num_seqs=1)).values()))


def test_quantization_and_tensor_parallelism_change_what_they_should():
    b = BatchShape(num_decode_tokens=8, num_seqs=8, attention_pairs=8 * 4000, kv_tokens_read=8 * 4000)
    base, w4, kv8 = _model(), _model(weight_dtype="int4"), _model(kv_dtype="int8")
    assert w4.breakdown(b)["weight_read"] == pytest.approx(base.breakdown(b)["weight_read"] / 4)
    assert kv8.kv_bytes_per_token == base.kv_bytes_per_token / 2
    hw = get_hardware("h100")[0]
    tp1, tp2 = hw.perf_model(base.shape, tp=1), hw.perf_model(base.shape, tp=2)
    assert tp2.breakdown(b)["communication"] > 0
    assert tp2.step_time(b) < tp1.step_time(b)
    with pytest.raises(ValueError, match="interconnect"):
        _model(tp=2)


def test_hardware_profiles_cover_the_issue_list():
    table = load_hardware()
    for key in ("h100", "h200", "a100", "l40s", "mi300x", "ascend910b"):
        hw = table[key]
        assert hw.bf16_tflops > 0 and hw.hbm_gbps > 0 and hw.hbm_gb > 0 and hw.price_per_hour > 0
        assert hw.price_source
    assert table["h200"].hbm_gbps > table["h100"].hbm_gbps
    with pytest.raises(ValueError, match="unknown device 'h300'.*h100"):
        get_hardware("h100,h300")


def test_shipped_cpu_profile_loads_and_predicts_positive_times():
    profile = load_profile()
    assert profile["cpu"] and profile["fit"]["num_steps"] > 10
    m = profile_perf_model(profile)
    assert m.step_time(BatchShape(num_decode_tokens=1, num_seqs=1, attention_pairs=10, kv_tokens_read=10)) > 0
