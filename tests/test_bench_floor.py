"""The workload floor (tokenmill/bench/floor.py) against a token-by-token count."""
from types import SimpleNamespace

import pytest

from tokenmill.bench.floor import layer_params, workload_floor
from tokenmill.bench.offline import Workload

SMOLLM2 = SimpleNamespace(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                          intermediate_size=1536, vocab_size=49152)


def test_layer_params_of_smollm2():
    # q 576x576, k and v 576x192, o 576x576, gate/up/down 576x1536: 3.54M per layer, 134.5M with the head
    assert layer_params(SMOLLM2) == 3_538_944
    assert layer_params(SMOLLM2) * 30 + 576 * 49152 == 134_479_872


def test_floor_counts_every_token():
    wl = Workload(prompts=[[1] * 5, [1] * 3], output_lens=[4, 2])
    kv = 1000.0
    f = workload_floor(SMOLLM2, wl, kv, matmul_gflops=1.0, read_gbps=1.0)
    body, head = layer_params(SMOLLM2) * 30, 576 * 49152
    flops = 0
    reads = 0
    for prompt, n_out in zip(wl.prompts, wl.output_lens):
        for _ in prompt:
            flops += 2 * body
        flops += 2 * head  # the last prompt token is sampled
        for i in range(n_out - 1):  # outputs fed back; the last one is never a forward input
            flops += 2 * body + 2 * head
            reads += (len(prompt) + i + 1) * kv
    attention = sum(4 * 9 * 64 * len(p) ** 2 / 2 for p in wl.prompts) * 30
    assert f.linear_s == pytest.approx(flops / 1e9)
    assert f.prefill_attention_s == pytest.approx(attention / 1e9)
    assert f.decode_kv_s == pytest.approx(reads / 1e9)
    assert f.output_tok_s == pytest.approx(6 / f.seconds)


@pytest.mark.parametrize("has_bf16", [True, False])
def test_bf16_floor_is_float32_peak_without_native_bf16(has_bf16, monkeypatch):
    """Without AVX512_BF16 bf16 weights are widened and multiplied in float32: its peak is the floor."""
    import torch

    from tokenmill.bench import peaks
    monkeypatch.setattr(peaks, "cpu_has_bf16", lambda: has_bf16)
    assert peaks.peak_dtype(torch.bfloat16) == (torch.bfloat16 if has_bf16 else torch.float32)
    assert peaks.peak_dtype(torch.float32) == torch.float32
