"""4-bit checkpoints made by AutoAWQ ("awq", GEMM layout) and GPTQ tools ("gptq"), read into our
block records, and written (`write_awq_linear`) in AutoAWQ's layout, which vLLM and transformers
read.

AWQ (per linear, W [in, out] in the checkpoint's orientation, groups along `in`):
  qweight int32 [in, out/8]   8 codes per int32, nibble i = column AWQ_ORDER[i] of each 8
  qzeros  int32 [in/g, out/8] zero points packed the same way
  scales  fp16  [in/g, out]   w = (code - zero) * scale
GPTQ: qweight int32 [in/8, out] (8 input rows per int32, nibble i = row i), qzeros int32
[groups, out/8] (sequential nibbles; version-1 checkpoints store zero - 1), scales fp16 [groups, out],
g_idx int32 [in] (the group of each input row; with act-order not sorted, and the layer then reads
its inputs through a permutation that makes the groups contiguous).

In our terms w[out, in] = d * code + m with d = scale and m = -zero * scale per 32-input block
(a group of 64 or 128 repeats its scale over its blocks).
"""
from __future__ import annotations

import torch

from tokenmill.quant.blocks import BLOCK, BlockQuantized

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def _unpack_cols(packed: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """[r, c/8] int32 -> [r, c] codes (0..15): nibble i of each int32, reordered to columns."""
    nibbles = (packed.to(torch.int32)[..., None] >> _SHIFTS) & 0xF  # [r, c/8, 8], nibble order
    if order is not None:
        nibbles = nibbles[..., list(order)]
    return nibbles.reshape(packed.shape[0], -1).to(torch.uint8)


def _pack_cols(codes: torch.Tensor, order: tuple[int, ...] | None) -> torch.Tensor:
    """[r, c] codes -> [r, c/8] int32, column order[i] of each 8 in nibble i."""
    r, c = codes.shape
    groups = codes.to(torch.int32).reshape(r, c // 8, 8)
    if order is not None:
        groups = groups[..., list(order)]
    return (groups << _SHIFTS).sum(-1, dtype=torch.int64).to(torch.int32)  # nibbles never overlap


def _blocks(codes_out_in: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group: int) -> BlockQuantized:
    """codes [out, in], zeros/scales [groups, out] -> our records' terms, repeated per 32-block."""
    if group % BLOCK:
        raise ValueError(f"group_size must be a multiple of {BLOCK}, got {group}")
    d = scales.float().T.contiguous()  # [out, groups]
    m = -zeros.float().T * d
    reps = group // BLOCK
    return BlockQuantized(codes_out_in.contiguous(), d.repeat_interleave(reps, 1), m.repeat_interleave(reps, 1), 4)


def read_awq_linear(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int) -> BlockQuantized:
    codes = _unpack_cols(qweight, AWQ_REVERSE_ORDER)  # [in, out]
    zeros = _unpack_cols(qzeros, AWQ_REVERSE_ORDER)  # [in/g, out]
    if codes.shape[1] != scales.shape[1] or zeros.shape != scales.shape:
        raise ValueError(f"AWQ tensors disagree: qweight {tuple(qweight.shape)}, qzeros {tuple(qzeros.shape)}, "
                         f"scales {tuple(scales.shape)}")
    return _blocks(codes.T, zeros, scales, group)


def write_awq_linear(w: BlockQuantized, group: int) -> dict[str, torch.Tensor]:
    """Our 4-bit blocks (one scale/minimum per `group` inputs, minimum = -zero * scale with an integer
    zero in 0..15) -> AWQ's qweight, qzeros, scales."""
    d = w.d[:, ::group // BLOCK]  # [out, groups]
    zeros = torch.where(d > 0, -w.m[:, ::group // BLOCK] / d, torch.zeros_like(d)).round().clamp(0, 15)
    return {"qweight": _pack_cols(w.codes.T.contiguous(), AWQ_ORDER),
            "qzeros": _pack_cols(zeros.T.to(torch.uint8).contiguous(), AWQ_ORDER),
            "scales": d.T.contiguous().half()}


def read_gptq_linear(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                     group: int, zero_offset: int = 1) -> tuple[BlockQuantized, torch.Tensor | None]:
    """-> (blocks over the inputs in group order, the input permutation or None when already in order)."""
    codes = _unpack_cols(qweight.T.contiguous(), None).T  # [in, out]: nibble i of row block = input row i
    zeros = _unpack_cols(qzeros, None).to(torch.int32) + zero_offset  # [groups, out]
    n_in = codes.shape[0]
    g_idx = torch.arange(n_in) // group if g_idx is None else g_idx.long()
    perm = None
    if not torch.equal(g_idx, torch.arange(n_in) // group):  # act-order: make each group contiguous
        perm = torch.argsort(g_idx, stable=True)
        if not torch.equal(g_idx[perm], torch.arange(n_in) // group):
            raise ValueError("GPTQ g_idx does not split the inputs into groups of group_size")
        codes = codes[perm]
    return _blocks(codes.T, zeros.clamp(0, 15), scales, group), perm


def _int4_zero_point_grid(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [n, k] -> (groups [n, k/g, g] float32, scale [n, k/g], zero [n, k/g]) by AWQ's rule."""
    n, k = w.shape
    if k % group or group % BLOCK:
        raise ValueError(f"in_features {k} must be divisible by group_size {group} (a multiple of {BLOCK})")
    g = w.float().reshape(n, k // group, group)
    lo, hi = torch.aminmax(g, dim=-1)
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)  # the range holds 0, so z is in 0..15
    # the checkpoint stores fp16 scales: clamp at fp16's smallest subnormal, or an all-zero group's
    # scale would round to 0 there and its zero point come out NaN
    scale = ((hi - lo) / 15).clamp(min=2.0 ** -24).half().float()
    return g, scale, torch.round(-lo / scale).clamp(0, 15)


def quantize_int4_zero_point(w: torch.Tensor, group: int) -> BlockQuantized:
    """AWQ's / GPTQ's asymmetric round to nearest per group: scale = (max - min) / 15, an integer
    zero point z = round(-min / scale) in 0..15, code = clamp(round(w / scale) + z, 0, 15)."""
    g, scale, zero = _int4_zero_point_grid(w, group)
    codes = (torch.round(g / scale[..., None]) + zero[..., None]).clamp(0, 15).to(torch.uint8)
    return _blocks(codes.reshape(w.shape), zero.T, scale.T, group)


def fake_quantize_int4_zero_point(w: torch.Tensor, group: int) -> torch.Tensor:
    """quantize_int4_zero_point(w, group).dequantize(), bit for bit (code * d + m with m = -z * d),
    without the uint8 codes and per-block records: the AWQ scale search calls it 21 times a layer."""
    g, scale, zero = _int4_zero_point_grid(w, group)
    scale, zero = scale[..., None], zero[..., None]
    q = torch.round(g / scale).add_(zero).clamp_(0, 15)
    return q.mul_(scale).add_(-zero * scale).reshape(w.shape)
