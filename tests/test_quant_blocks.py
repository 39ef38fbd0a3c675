"""Block-quantized weights (tokenmill/quant/blocks.py, kernels/csrc/quant_gemm.cpp): GGUF block
parsing against gguf-py's own dequantizer, packing round trips, and the q4/q8 linear kernels on every
ISA path this CPU runs against a float64 reference that quantizes the activations by the same rule
(per row and 32-block: d = max|x|/127, code = round-half-even(x/d)); tolerance 1e-5 relative to the
output's scale (float32 sums in another order)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize
from hypothesis import given, settings, strategies as st

from tokenmill.kernels import cpu_ops
from tokenmill.quant.blocks import BlockQuantized, from_gguf_blocks, quantize_q8

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="C++ CPU kernels unavailable")

LEVELS = ["avx512_bf16", "avx2", "scalar"]


@pytest.fixture(autouse=True)
def _restore_isa():
    yield
    cpu_ops.set_isa("auto")


def reference_linear(x: torch.Tensor, w: BlockQuantized, bias: torch.Tensor | None) -> torch.Tensor:
    """float64: quantized activations times the weights the codes stand for."""
    m, k = x.shape
    xb = x.double().view(m, k // 32, 32)
    d = (xb.abs().amax(-1) / 127).float().double()
    inv = torch.where(d > 0, 127 / xb.abs().amax(-1).float().double(), torch.zeros_like(d))
    qx = torch.round((xb.float() * inv.float()[..., None]).double())
    deq_x = (qx * d[..., None]).view(m, k)
    y = deq_x @ half_scales(w).dequantize().double().T
    return y if bias is None else y + bias.double()


def half_scales(w: BlockQuantized) -> BlockQuantized:
    """The weights as packed: scales and minimums are stored as float16."""
    m = None if w.m is None else w.m.half().float()
    return BlockQuantized(w.codes, w.d.half().float(), m, w.bits)


def random_q4(n: int, k: int, gen: torch.Generator) -> BlockQuantized:
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    d = torch.rand(n, k // 32, generator=gen) * 0.1
    return BlockQuantized(codes, d, -8 * d + 0.01 * torch.randn(n, k // 32, generator=gen), 4)


def random_q8(n: int, k: int, gen: torch.Generator) -> BlockQuantized:
    # -128 included: compressed-tensors' symmetric int8 (scale max/127.5) writes it, GGUF never does
    codes = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    codes[:, 0] = -128
    return BlockQuantized(codes, torch.rand(n, k // 32, generator=gen) * 0.01, None, 8)


def run(w: BlockQuantized, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    from tokenmill.quant.blocks import pack
    op = torch.ops.tokenmill.q4_linear if w.bits == 4 else torch.ops.tokenmill.q8_linear
    return op(x, pack(w), w.shape[0], bias)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 70), kb=st.integers(1, 6), m=st.integers(1, 9), bits=st.sampled_from([4, 8]),
       with_bias=st.booleans(), level=st.sampled_from(LEVELS), seed=st.integers(0, 2**16))
def test_kernels_match_reference(n, kb, m, bits, with_bias, level, seed):
    cpu_ops.set_isa(level)
    gen = torch.Generator().manual_seed(seed)
    k = 32 * kb
    w = random_q4(n, k, gen) if bits == 4 else random_q8(n, k, gen)
    x = torch.randn(m, k, generator=gen) * 3
    x[0, :32] = 0  # an all-zero block: scale 0, no division by it
    bias = torch.randn(n, generator=gen) if with_bias else None
    y = run(w, x, bias)
    ref = reference_linear(x, w, bias)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref, rtol=0, atol=1e-5 * ref.abs().max().item() + 1e-6)


@pytest.mark.parametrize("m", [1, 4, 33, 300])
def test_isa_paths_agree_on_layer_shapes(m):
    """Every path on the default model's shapes, batch 1 to a prefill chunk (more rows than one pass)."""
    gen = torch.Generator().manual_seed(m)
    w = random_q4(1536, 576, gen)
    x = torch.randn(m, 576, generator=gen)
    outs = {}
    for level in LEVELS:
        cpu_ops.set_isa(level)
        outs[level] = run(w, x, None)
    for level in LEVELS[1:]:
        torch.testing.assert_close(outs[level], outs[LEVELS[0]], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_parse_like_gguf_py(type_name):
    x = np.random.default_rng(0).standard_normal((24, 96)).astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    raw = gguf_quantize(x, qtype)
    blocks = from_gguf_blocks(raw, type_name, 24, 96)
    assert blocks.bits == (8 if type_name == "Q8_0" else 4)
    np.testing.assert_allclose(blocks.dequantize().numpy(), gguf_dequantize(raw, qtype), rtol=0, atol=1e-6)


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_round_trip(bits):
    from tokenmill.quant.blocks import pack
    gen = torch.Generator().manual_seed(bits)
    w = random_q4(37, 64, gen) if bits == 4 else random_q8(37, 64, gen)
    packed = pack(w)
    expected = half_scales(w).dequantize()
    torch.testing.assert_close(torch.ops.tokenmill.q_dequantize(packed, bits, 37, 64), expected, rtol=0, atol=0)
    ids = torch.tensor([36, 0, 17, 17])
    torch.testing.assert_close(torch.ops.tokenmill.q_dequantize_rows(packed, bits, 37, 64, ids), expected[ids],
                               rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.tokenmill.q_dequantize_rows(packed, bits, 37, 64, torch.tensor([37]))


def test_q8_requantization_is_exact():
    """A Q8_0 tensor dequantized and quantized again gives back its codes (a tied LM head relies on it)."""
    x = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    raw = gguf_quantize(x, GGMLQuantizationType.Q8_0)
    original = from_gguf_blocks(raw, "Q8_0", 16, 64)
    again = quantize_q8(original.dequantize())
    assert torch.equal(again.codes, original.codes)
    torch.testing.assert_close(again.d, original.d, rtol=0, atol=0)


def test_bad_shapes_are_refused():
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.tokenmill.pack_q4(torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 1), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_q8(torch.zeros(4, 48))
    packed = torch.ops.tokenmill.pack_q8(torch.zeros(16, 64, dtype=torch.int8), torch.zeros(16, 2))
    with pytest.raises(RuntimeError, match="records do not hold"):
        torch.ops.tokenmill.q8_linear(torch.zeros(1, 64), packed, 32, None)
