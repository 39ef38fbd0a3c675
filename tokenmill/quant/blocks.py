"""Block-quantized weights: 4- or 8-bit codes with a scale (and, for 4 bits, a minimum) per 32
consecutive inputs of an output row — GGUF's Q4_0 / Q4_1 / Q8_0, and our int8 (per output channel)
and int4 (round to nearest per group of 32/64/128) weight-only formats — and the Linear method and
embedding that compute on them through our C++ kernels (kernels/csrc/quant_gemm.cpp: activations
quantized to int8 per row and block on the fly, integer dot products, float32 out).

`BlockQuantized` is what a checkpoint hands a layer (one tensor, or one shard of a fused layer);
`BlockLinearMethod` collects the shards and packs them once at load: all 4-bit shards pack as 4-bit,
anything else (8-bit, a mix, a float weight such as a tied embedding) as 8-bit codes per 32
(`quantize_q8`, near-lossless: a Q8_0 tensor requantizes to the same codes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear, LinearMethod, NativeLinear

BLOCK = 32


@dataclass
class BlockQuantized:
    """codes [N, K] (uint8 0..15 for 4 bits, int8 for 8 bits), d and m [N, K/32] float32:
    w = d * code + m (m is None for 8 bits)."""
    codes: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None
    bits: int

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        n, k = self.codes.shape
        w = self.codes.float().view(n, k // BLOCK, BLOCK) * self.d[..., None]
        if self.m is not None:
            w = w + self.m[..., None]
        return w.view(n, k)

    def rows(self, rows: slice) -> BlockQuantized:
        return BlockQuantized(self.codes[rows], self.d[rows], None if self.m is None else self.m[rows], self.bits)


def quantize_q8(w: torch.Tensor) -> BlockQuantized:
    """Symmetric 8-bit codes per 32 inputs (Q8_0's rule: d = max|w| / 127, code = round(w / d))."""
    n, k = w.shape
    _check_divisible(k, BLOCK, "8-bit block")
    blocks = w.float().reshape(n, k // BLOCK, BLOCK)
    d = blocks.abs().amax(-1) / 127.0
    # float16 scales, as the kernels store them: codes are rounded against the scale they will meet
    d = d.half().float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.round(blocks * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    return BlockQuantized(codes.view(n, k), d, None, 8)


# -- GGUF block layouts (ggml's quants: per block of 32, a float16 scale first) -------------------
def _f16(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(qs: np.ndarray) -> np.ndarray:
    # byte j holds element j (low nibble) and element j + 16 (high nibble)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def from_gguf_blocks(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockQuantized:
    """raw: [n, row bytes] uint8 of a Q4_0 / Q4_1 / Q8_0 tensor with n rows of k inputs."""
    nb = k // BLOCK
    if type_name == "Q4_1":
        b = raw.reshape(n, nb, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        codes = torch.from_numpy(_nibbles(b[..., 4:20]).reshape(n, k))
        return BlockQuantized(codes, d, m, 4)
    if type_name == "Q4_0":
        b = raw.reshape(n, nb, 18)
        d = _f16(b[..., 0:2])
        codes = torch.from_numpy(_nibbles(b[..., 2:18]).reshape(n, k))
        return BlockQuantized(codes, d, -8.0 * d, 4)
    if type_name == "Q8_0":
        b = raw.reshape(n, nb, 34)
        d = _f16(b[..., 0:2])
        codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:34]).view(np.int8).reshape(n, k))
        return BlockQuantized(codes, d, None, 8)
    raise ValueError(f"GGUF block type {type_name!r} is not kept quantized (Q4_0, Q4_1, Q8_0 are)")


GGUF_NATIVE_TYPES = ("Q4_0", "Q4_1", "Q8_0")


# -- the Linear method ---------------------------------------------------------------------------
class BlockLinearMethod(LinearMethod):
    """y = x Wᵀ + b on packed block records (`layer.records`, `layer.bits`). `quantize` turns a float
    checkpoint tensor into blocks (int8 / int4 RTN); without it a float tensor keeps its layer float
    (F.linear), and only a tied head (no tensor of its own) is quantized, to 8 bits per 32."""

    def __init__(self, quantize=None) -> None:
        self.quantize = quantize  # None: float checkpoint tensors stay float (a GGUF's F32/F16 tensors)

    def create_weights(self, layer: Linear, in_features: int, out_features: int, bias: bool) -> None:
        # a shape-only placeholder: parameter counts still see [out, in]; the codes arrive per shard
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, device="meta"), requires_grad=False)
        layer.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        layer.shards = []

    def load_weight(self, layer: Linear, name: str, tensor, rows: slice | None) -> None:
        if name != "weight":
            return super().load_weight(layer, name, tensor, rows)
        rows = rows or slice(0, layer.out_features)
        if not isinstance(tensor, BlockQuantized) and self.quantize and layer.in_features % BLOCK == 0:
            tensor = self.quantize(tensor)  # (otherwise the layer stays float, see load)
        expected = (rows.stop - rows.start, layer.in_features)
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{layer.prefix}.weight: checkpoint shape {tuple(tensor.shape)}, expected {expected}")
        layer.shards.append((rows, tensor))

    def load(self, layer: Linear) -> None:
        shards = layer.shards
        layer.shards = []
        floats = any(not isinstance(t, BlockQuantized) for _, t in shards)
        if floats or layer.in_features % BLOCK or not cpu_ops.load():
            # float checkpoint tensors, no blocks of 32 inputs, or no C++ kernels here: F.linear
            layer.records = None
            if shards:
                rows = sorted(shards, key=lambda s: s[0].start)
                w = torch.cat([t.dequantize() if isinstance(t, BlockQuantized) else t.float() for _, t in rows])
                layer.weight = nn.Parameter(w, requires_grad=False)
            return
        if not shards:  # tied to a float weight (e.g. the embedding): quantize it here
            shards = [(slice(0, layer.out_features), (self.quantize or quantize_q8)(layer.weight.detach()))]
        layer.bits = 4 if all(t.bits == 4 for _, t in shards) else 8
        whole = _concat(shards, layer.out_features, layer.bits)
        layer.records = pack(whole)
        if layer.tied:  # the float weight stays with the embedding; our copy is the records
            layer.tied_source = layer.weight  # until the embedding takes the records (GGUFConfig.process_model)
        # shape-only again: materializing the model (to_empty) gave the placeholder float storage
        layer.weight = nn.Parameter(torch.empty(layer.weight.shape, device="meta"), requires_grad=False)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.records is None:
            return F.linear(x, layer.weight, layer.bias)
        lead = x.shape[:-1]
        op = torch.ops.tokenmill.q4_linear if layer.bits == 4 else torch.ops.tokenmill.q8_linear
        y = op(x.reshape(-1, layer.in_features), layer.records, layer.out_features, layer.bias)
        return y.view(*lead, layer.out_features)

    def apply_argmax(self, layer: Linear, x: torch.Tensor, n_valid: int) -> torch.Tensor | None:
        """Greedy tokens without the logits (csrc/quant_argmax.cpp): the q4/q8_linear values, bit for bit."""
        if layer.records is None or layer.bias is not None or x.dim() != 2 or x.dtype != torch.float32:
            return None
        return torch.ops.tokenmill.q_argmax_linear(x, layer.records, layer.bits, layer.out_features, n_valid)

    def native(self, layer: Linear) -> NativeLinear | None:
        if layer.records is None:
            return None
        return NativeLinear(2 if layer.bits == 4 else 3, layer.records, layer.bias)


def _concat(shards: list[tuple[slice, BlockQuantized]], n: int, bits: int) -> BlockQuantized:
    shards = sorted(shards, key=lambda s: s[0].start)
    covered = [r.start for r, _ in shards] + [n]
    if covered[0] != 0 or any(r.stop != nxt for (r, _), nxt in zip(shards, covered[1:])):
        raise ValueError(f"weight shards {[(r.start, r.stop) for r, _ in shards]} do not cover rows 0..{n}")
    parts = [t if t.bits == bits else quantize_q8(t.dequantize()) for _, t in shards]
    if len(parts) == 1:
        return parts[0]
    m = None if bits == 8 else torch.cat([p.m for p in parts])
    return BlockQuantized(torch.cat([p.codes for p in parts]), torch.cat([p.d for p in parts]), m, bits)


def pack(t: BlockQuantized) -> torch.Tensor:
    if t.bits == 4:
        return torch.ops.tokenmill.pack_q4(t.codes.contiguous(), t.d, t.m)
    return torch.ops.tokenmill.pack_q8(t.codes.contiguous(), t.d)


class BlockEmbedding(nn.Module):
    """An embedding table kept as block records (shared with a tied LM head): the rows a step looks
    up are dequantized (torch.ops.tokenmill.q_dequantize_rows)."""

    def __init__(self, records: torch.Tensor, bits: int, num_embeddings: int, embedding_dim: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.records, self.bits = records, bits
        self.num_embeddings, self.embedding_dim, self.dtype = num_embeddings, embedding_dim, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.ops.tokenmill.q_dequantize_rows(self.records, self.bits, self.num_embeddings,
                                                     self.embedding_dim, ids.reshape(-1))
        return rows.to(self.dtype).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}"


def quantize_int8_per_channel(w: torch.Tensor) -> BlockQuantized:
    """int8 weight-only, one scale per output row (max|w| / 127), stored as 8-bit blocks whose scales
    repeat along the row."""
    n, k = w.shape
    _check_divisible(k, BLOCK, "int8")
    d = (w.float().abs().amax(1, keepdim=True) / 127.0).half().float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.round(w.float() * inv).clamp_(-127, 127).to(torch.int8)
    return BlockQuantized(codes, d.expand(n, k // BLOCK).contiguous(), None, 8)


def quantize_int4(w: torch.Tensor, group: int) -> BlockQuantized:
    """int4 weight-only, round to nearest, asymmetric per group of `group` inputs (32, 64 or 128):
    d = (max - min) / 15, w ≈ d * code + min (Q4_1's rule for group 32); larger groups repeat their
    scale over their 32-blocks."""
    n, k = w.shape
    _check_divisible(k, group, "int4")
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15.0).half().float()
    m = lo.half().float()
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.round((g - m[..., None]) * inv[..., None]).clamp_(0, 15).to(torch.uint8)
    per_block = group // BLOCK
    return BlockQuantized(codes.view(n, k), d.repeat_interleave(per_block, 1), m.repeat_interleave(per_block, 1), 4)


def _check_divisible(k: int, group: int, name: str) -> None:
    if k % group:
        raise ValueError(f"{name} weight quantization needs in_features divisible by {group}, got {k}")
