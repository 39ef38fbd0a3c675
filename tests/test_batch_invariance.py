"""Batch-invariant mode (EngineConfig.batch_invariant): a row's result never depends on the rows it
shares a kernel call with, so a sequence's logits are the same alone, in a batch, or verified k+1
rows at a time by speculative decoding. Checked bit for bit (tolerance 0): every GEMM path this CPU
runs, then the engine's logprobs in bfloat16 alone vs batched and with vs without speculation."""
from __future__ import annotations

import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.kernels import cpu_ops
from tokenmill.quant.blocks import pack, quantize_int4, quantize_q8

needs_kernels = pytest.mark.skipif(not cpu_ops.load(), reason="the C++ kernels did not build here")


@pytest.fixture
def invariant():
    """Batch-invariant mode on for one test (it is process-wide), off again afterwards."""
    cpu_ops.set_batch_invariant(True)
    yield
    cpu_ops.set_batch_invariant(False)


def _row_differences() -> list[str]:
    """(path, M) where some row computed within a call of M rows differs from that row alone."""
    torch.manual_seed(0)
    n, k = 80, 96  # a partial last panel, K not a multiple of the accumulator sets
    w = torch.randn(n, k)
    ops = {"bf16": (torch.ops.tokenmill.bf16_panel_linear, torch.ops.tokenmill.pack_bf16_panels(w.bfloat16())),
           "f32": (torch.ops.tokenmill.panel_linear, torch.ops.tokenmill.pack_panels(w)),
           "q8": (torch.ops.tokenmill.q8_linear, pack(quantize_q8(w))),
           "q4": (torch.ops.tokenmill.q4_linear, pack(quantize_int4(w, 32)))}
    x = torch.randn(40, k)
    found = []
    try:
        for level in cpu_ops.runnable_levels():
            cpu_ops.set_isa(level)
            for name, (op, packed) in ops.items():
                alone = torch.cat([op(x[i:i + 1], packed, n, None) for i in range(len(x))])
                for m in (2, 3, 5, 7, 13, 17, 40):
                    if not torch.equal(op(x[:m], packed, n, None), alone[:m]):
                        found.append(f"{level} {name} M={m}")
    finally:
        cpu_ops.set_isa("auto")
    return found


@needs_kernels
def test_every_gemm_path_is_row_invariant_in_batch_invariant_mode(invariant):
    assert _row_differences() == []


@needs_kernels
def test_without_the_mode_the_float_gemms_do_depend_on_the_row_count():
    """The control: the check above can fail (the tuned kernels split K by the row count)."""
    assert any(" f32 " in d or " bf16 " in d for d in _row_differences())


PROMPTS = [[5, 9, 33, 7, 81, 9, 33, 7, 12, 9, 33], list(range(40, 63)), [300, 301, 302, 300, 301, 302, 300],
           [7] * 5, list(range(100, 160, 3)), [11, 12, 13, 14, 11, 12, 13, 14, 11]]


def _generate(llm: LLM, prompts: list[list[int]]):
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def _logprobs(outs) -> list[list[float]]:
    return [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]


@needs_kernels
def test_logprobs_are_identical_alone_batched_and_speculated_in_bfloat16(tiny_llama, invariant):
    kw = dict(dtype="bfloat16", num_kv_blocks=256, block_size=4, batch_invariant=True)
    plain = LLM(str(tiny_llama), **kw)
    batched = _logprobs(_generate(plain, PROMPTS))
    alone = [_logprobs(_generate(plain, [p]))[0] for p in PROMPTS]
    assert batched == alone  # exact floats: same tokens and the same logits behind them
    spec = LLM(str(tiny_llama), speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                    "prompt_lookup_min": 1}, **kw)
    outs = _generate(spec, PROMPTS)
    assert _logprobs(outs) == batched
    # only meaningful if drafts were verified
    assert sum(o.metrics.spec_decoding.num_draft_tokens for o in outs if o.metrics.spec_decoding) > 0


def test_batch_invariant_needs_our_kernels_and_their_dtypes(tiny_llama):
    with pytest.raises(ValueError, match="batch_invariant needs our C\\+\\+ kernels and attention_backend"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16, batch_invariant=True, attention_backend="torch")
    if cpu_ops.load():
        with pytest.raises(ValueError, match="batch_invariant needs dtype float32 or bfloat16"):
            LLM(str(tiny_llama), dtype="float16", num_kv_blocks=16, batch_invariant=True)
    assert not cpu_ops.batch_invariant()
