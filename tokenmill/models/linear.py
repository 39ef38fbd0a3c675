"""Dense linear layer with the fastest CPU GEMM we measured.

On this class of machine (2 cores, AVX2) oneDNN's linear runs 1.6-2x faster than F.linear (MKL
with a transposed weight) at decode batch sizes; see docs/BENCHMARKS.md. Falls back to F.linear
where the oneDNN op is missing or the dtype/shape is unsupported."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _has_onednn_linear() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _has_onednn_linear()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x: [..., in], weight: [out, in]."""
    if _ONEDNN and x.dtype == torch.float32 and not x.requires_grad and x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
