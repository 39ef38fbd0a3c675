"""Plain floating-point weights, three ways to multiply them on a CPU:

- `PanelLinearMethod` (float32 with our C++ kernels): the weight is packed once into 16-column
  panels for `torch.ops.tokenmill.panel_linear`. On a 2-core AVX2 machine it matches or beats
  oneDNN at every batch size (docs/BENCHMARKS.md, "GEMM").
- `OneDNNLinearMethod` (float32 without our kernels): oneDNN's blocked layout, prepacked once.
- `PlainLinearMethod` (every other dtype): F.linear.

The packing methods free the plain weight after packing (a shape-only meta tensor stays, so
parameter and byte counts still see it) unless it is tied to another module.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear, LinearMethod


def _has_onednn_linear() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


def _packable(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.dim() == 2 and not x.requires_grad


class PlainLinearMethod(LinearMethod):
    def create_weights(self, layer: Linear, in_features: int, out_features: int, bias: bool) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        layer.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)


class _PackedLinearMethod(PlainLinearMethod):
    """Packs the float32 weight once after loading; non-float32 inputs (none in a float32 model)
    use the plain weight while it is kept."""

    def load(self, layer: Linear) -> None:
        layer.packed = self.pack(layer.weight.detach())
        if not layer.tied:
            layer.weight = nn.Parameter(torch.empty(layer.weight.shape, device="meta"), requires_grad=False)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        packed = getattr(layer, "packed", None)
        if packed is not None and _packable(x):
            return self.apply_packed(layer, x, packed)
        return F.linear(x, layer.weight, layer.bias)


class PanelLinearMethod(_PackedLinearMethod):
    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.pack_panels(weight)  # [out/16, in, 16]

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.panel_linear(x, packed, layer.out_features, layer.bias)


class OneDNNLinearMethod(_PackedLinearMethod):
    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight)

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, layer.bias, "none", [], "")


class UnquantizedConfig:
    """Picks the fastest method for the model dtype on this machine."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def get_linear_method(self, prefix: str) -> LinearMethod:
        if self.dtype == torch.float32:
            if cpu_ops.load():
                return PanelLinearMethod()
            if _has_onednn_linear():
                return OneDNNLinearMethod()
        return PlainLinearMethod()
