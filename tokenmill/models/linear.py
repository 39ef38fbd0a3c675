"""Dense linear layer with the fastest CPU GEMM we measured.

`prepack()` is called once after the weights are loaded. With our C++ kernels it packs the float32
weight into 16-column panels for `torch.ops.tokenmill.panel_linear`, which on this class of machine
(2 cores, AVX2) matches or beats oneDNN at every batch size: 1.3-2x at 1-8 rows (it streams the
weight at 17-20 GB/s), 1.1-1.5x at 16-64 rows, parity at prefill sizes (see docs/BENCHMARKS.md).
Without the kernels it falls back to oneDNN's blocked layout (`_reorder_linear_weight`), and to
F.linear where neither applies. The plain copy is freed (a shape-only placeholder stays) unless the
weight is shared, e.g. tied to the embedding."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops


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
        self.panels: torch.Tensor | None = None  # [out/16, in, 16] for panel_linear (float32)
        self.onednn: torch.Tensor | None = None  # oneDNN blocked copy, when our kernels are unavailable

    def prepack(self, free_plain: bool) -> None:
        w = self.weight.detach()
        if w.dtype != torch.float32:
            return
        if cpu_ops.load():
            self.panels = torch.ops.tokenmill.pack_panels(w)
        elif _ONEDNN and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            self.onednn = torch.ops.mkldnn._reorder_linear_weight(w)
        else:
            return
        if free_plain:  # the shape stays visible (parameter counts, byte counts), the memory goes
            self.weight = nn.Parameter(torch.empty(self.weight.shape, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.dim() == 2 and not x.requires_grad:
            if self.panels is not None:
                return torch.ops.tokenmill.panel_linear(x, self.panels, self.weight.shape[0], self.bias)
            if self.onednn is not None:
                return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.onednn, self.bias, "none", [], "")
        return linear(x, self.weight, self.bias)


def prepack_linears(model: nn.Module) -> None:
    """Prepack every Linear of a loaded model; shared weights (tied embeddings) keep their plain copy."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    for m in model.modules():
        if isinstance(m, Linear):
            m.prepack(free_plain=counts[id(m.weight)] == 1)
