"""Plain floating-point weights, three ways to multiply them on a CPU:

- `PanelLinearMethod` (float32 with our C++ kernels): the weight is packed once into 16-column
  panels for `torch.ops.tokenmill.panel_linear`. On a 2-core AVX2 machine it matches or beats
  oneDNN at every batch size (docs/BENCHMARKS.md, "GEMM").
- `OneDNNLinearMethod` (float32 without our kernels): oneDNN's blocked layout, prepacked once.
- `Bf16PanelLinearMethod` (bfloat16 with our C++ kernels): bf16 weights packed once into 32-column
  panels for `torch.ops.tokenmill.bf16_panel_linear`, float32 activations in and out; the kernel
  picks AVX512_BF16 dot products, AVX-512 or AVX2 widening at run time (kernels/csrc/cpu_isa.h).
  The model around it then runs float32 activations (norms, RoPE, attention on float32 rows, the
  residual stream never rounded to bf16) while weights and the KV cache are bf16.
- `OneDNNBf16LinearMethod` (bfloat16 on CPUs whose OS grants AMX tiles): oneDNN's prepacked bf16
  weight, which runs on AMX there (we have no AMX kernel of our own); float32 activations in and
  out as with the panels. Elsewhere our panels match or beat it (docs/BENCHMARKS.md).
- `PlainLinearMethod` (every other dtype): F.linear.

The packing methods free the plain weight after packing (a shape-only meta tensor stays, so
parameter and byte counts still see it) unless it is tied to another module.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear, LinearMethod, NativeLinear


def _has_onednn_linear() -> bool:
    try:
        return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):
        return False


def _has_onednn_bf16_linear() -> bool:
    """oneDNN's bf16 linear needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere torch refuses the reorder."""
    try:
        return _has_onednn_linear() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
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
    use the plain weight while it is kept. `native_kind`: the NativeLinear kind of our panel formats
    (None: the packed layout is not ours)."""

    native_kind: int | None = None

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

    def native(self, layer: Linear) -> NativeLinear | None:
        packed = getattr(layer, "packed", None)
        if packed is None or self.native_kind is None:
            return None
        return NativeLinear(self.native_kind, packed, layer.bias)


class PanelLinearMethod(_PackedLinearMethod):
    native_kind = 0

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.pack_panels(weight)  # [out/16, in, 16]

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.panel_linear(x, packed, layer.out_features, layer.bias)


class Bf16PanelLinearMethod(_PackedLinearMethod):
    native_kind = 1
    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.pack_bf16_panels(weight.to(torch.bfloat16))  # [out/32, in/2, 32, 2]

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        packed = getattr(layer, "packed", None)
        if packed is None or x.dim() != 2:
            return F.linear(x, layer.weight, layer.bias)
        return self.apply_packed(layer, x, packed)

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.tokenmill.bf16_panel_linear(x, packed, layer.out_features, layer.bias)

    def swiglu_fusable(self, layer: Linear, down: Linear) -> bool:
        inter = layer.output_sizes[0]
        return (getattr(layer, "packed", None) is not None and layer.bias is None and len(layer.output_sizes) == 2
                and layer.output_sizes[1] == inter and inter % 32 == 0
                and type(down.quant_method) is Bf16PanelLinearMethod)

    def apply_swiglu(self, layer: Linear, x: torch.Tensor, down: Linear) -> torch.Tensor | None:
        """On AVX-512 CPUs silu(g) * u leaves the gate/up GEMM's registers: as bf16 rows where the down
        projection rounds its input to bf16 anyway (AVX512_BF16, 3+ rows), else as float32 rows; on
        AVX2 the kernel runs the unfused ops and returns float32 (csrc/bf16_gemm.cpp, bf16_swiglu)."""
        if not _packable(x) or not self.swiglu_fusable(layer, down):
            return None
        return torch.ops.tokenmill.bf16_swiglu(x, layer.packed, layer.output_sizes[0])

    def apply_argmax(self, layer: Linear, x: torch.Tensor, n_valid: int) -> torch.Tensor | None:
        """On AVX-512 CPUs the logits stay in registers (csrc/bf16_gemm.cpp, bf16_argmax_linear)."""
        packed = getattr(layer, "packed", None)
        if packed is None or layer.bias is not None or not _packable(x):
            return None
        return torch.ops.tokenmill.bf16_argmax_linear(x, packed, layer.out_features, n_valid)


class OneDNNBf16LinearMethod(Bf16PanelLinearMethod):
    native_kind = None  # oneDNN's packed layout is not our panels: no SwiGLU, argmax or C++ callers

    def swiglu_fusable(self, layer: Linear, down: Linear) -> bool:
        return False

    def apply_argmax(self, layer: Linear, x: torch.Tensor, n_valid: int) -> torch.Tensor | None:
        return None

    def load(self, layer: Linear) -> None:
        super().load(layer)
        layer.bias_bf16 = None if layer.bias is None else layer.bias.to(torch.bfloat16)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16))

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16).contiguous(), packed, layer.bias_bf16, "none",
                                               [], "")
        return y.float()


class OneDNNLinearMethod(_PackedLinearMethod):
    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight)

    def apply_packed(self, layer: Linear, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, layer.bias, "none", [], "")


class UnquantizedConfig:
    """Picks the fastest method for the model dtype on this machine, and the dtype the model's
    activations then run in (`activation_dtype`: float32 around bf16 panel weights)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.bf16_panels = dtype == torch.bfloat16 and cpu_ops.load()
        # AMX tiles granted by the OS: oneDNN's bf16 kernels use them, ours do not (and oneDNN's
        # blocking varies with the batch: batch-invariant mode keeps our panels)
        self.bf16_onednn = (self.bf16_panels and "amx=usable" in cpu_ops.isa() and _has_onednn_bf16_linear()
                            and not cpu_ops.batch_invariant())

    @property
    def activation_dtype(self) -> torch.dtype:
        return torch.float32 if self.bf16_panels else self.dtype

    def get_linear_method(self, prefix: str) -> LinearMethod:
        if self.bf16_panels:
            return OneDNNBf16LinearMethod() if self.bf16_onednn else Bf16PanelLinearMethod()
        if self.dtype == torch.float32:
            if cpu_ops.load():
                return PanelLinearMethod()
            if _has_onednn_linear():
                return OneDNNLinearMethod()
        return PlainLinearMethod()
