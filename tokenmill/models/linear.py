"""Dense linear layer with the fastest CPU GEMM we measured.

On this class of machine (2 cores, AVX2) oneDNN's linear runs 1.6-2x faster than F.linear (MKL
with a transposed weight) at decode batch sizes, and 1.1-1.9x faster again once its weight is
prepacked into oneDNN's blocked layout (no per-call reorder; biggest gain at 8-32 rows); at 1-4
rows our skinny C++ kernel streams the plain weight at 17-19 GB/s against oneDNN's 11-13; see
docs/BENCHMARKS.md. `prepack()` is called once after the weights are loaded; it frees the plain copy
(keeping a shape-only placeholder) unless the weight is shared, e.g. tied to the embedding. Falls
back to F.linear where the oneDNN op is missing or the dtype/shape is unsupported."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops

SKINNY_ROWS = 4  # at most this many rows go to torch.ops.tokenmill.skinny_linear (decode batches)


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
        self.packed: torch.Tensor | None = None  # oneDNN blocked copy of weight (float32 only)

    def prepack(self, free_plain: bool) -> None:
        if not (_ONEDNN and self.weight.dtype == torch.float32 and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
            return
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
        if free_plain:  # the shape stays visible (parameter counts, byte counts), the memory goes
            self.weight = nn.Parameter(torch.empty(self.weight.shape, device="meta"), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dtype == torch.float32 and x.dim() == 2:
            if x.shape[0] <= SKINNY_ROWS and not self.weight.is_meta and cpu_ops.load():
                return torch.ops.tokenmill.skinny_linear(x, self.weight, self.bias)
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        return linear(x, self.weight, self.bias)


def prepack_linears(model: nn.Module, keep_plain_bytes: int = 2 << 30) -> None:
    """Prepack every Linear of a loaded model. Shared weights (tied embeddings) keep their plain
    copy; so do all of them while the plain copies total at most `keep_plain_bytes`, for the skinny
    kernel used at 1-4 rows (it streams a plain row-major weight 1.4x faster than oneDNN's packed one)."""
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    keep_all = sum(m.weight.numel() * m.weight.element_size() for m in linears) <= keep_plain_bytes
    for m in linears:
        m.prepack(free_plain=counts[id(m.weight)] == 1 and not keep_all)
