"""The greedy LM head on block-quantized weights (csrc/quant_argmax.cpp) against argmax over the logits
q4_linear / q8_linear write: equal indices at tolerance 0 (the same values, scanned without being
written), at every kernel level this CPU runs."""
import pytest
import torch

from tokenmill.kernels import cpu_ops
from tokenmill.quant.blocks import pack, quantize_int4, quantize_q8

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="the C++ kernels did not build here")


def _records(w: torch.Tensor, bits: int) -> torch.Tensor:
    return pack(quantize_int4(w, 32) if bits == 4 else quantize_q8(w))


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
@pytest.mark.parametrize("bits", [4, 8])
def test_greedy_head_equals_the_logits_argmax(level, bits):
    torch.manual_seed(0)
    n, k = 200, 96  # a partial last group of 16 rows
    records = _records(torch.randn(n, k), bits)
    linear = torch.ops.tokenmill.q4_linear if bits == 4 else torch.ops.tokenmill.q8_linear
    cpu_ops.set_isa(level)
    try:
        for m in (1, 3, 5, 37):
            x = torch.randn(m, k)
            logits = linear(x, records, n, None)
            for n_valid in (n, 190, 17):
                got = torch.ops.tokenmill.q_argmax_linear(x, records, bits, n, n_valid)
                assert torch.equal(got, logits[:, :n_valid].argmax(-1)), (m, n_valid)
    finally:
        cpu_ops.set_isa("auto")


@pytest.mark.parametrize("bits", [4, 8])
def test_ties_take_the_first_column(bits):
    """Rows 5 and 150 of W are equal and largest: their logits tie, and the first wins (torch.argmax)."""
    torch.manual_seed(1)
    n, k = 160, 64
    w = torch.randn(n, k) * 0.1
    w[5] = w[150] = 1.0
    records = _records(w, bits)
    x = torch.ones(4, k)
    assert torch.ops.tokenmill.q_argmax_linear(x, records, bits, n, n).tolist() == [5] * 4
    assert torch.ops.tokenmill.q_argmax_linear(x, records, bits, n, 100).tolist() == [5] * 4
    assert torch.ops.tokenmill.q_argmax_linear(x, records, bits, n, 5).tolist() != [5] * 4
