"""A linear layer whose storage and matmul belong to its `quant_method`, a `LinearMethod`: the
weight-format seam.

A method does four things for its layer: `create_weights` (parameters on the layer, any dtype or
packing), `load_weight` (one checkpoint tensor into a parameter, optionally into one shard of a
fused layer — the per-parameter weight loader), `load` (once every tensor is in: repack, free
what is not needed) and `apply` (y = x Wᵀ + b). A weight format (int8, int4, GGUF blocks, ...) is a
new method; model code never branches on it. The unquantized methods live in
tokenmill/quant/unquantized.py.

Fused layers (q/k/v, gate/up) declare `output_sizes`: shard i of a checkpoint lands in rows
sum(output_sizes[:i]) .. sum(output_sizes[:i+1]).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class NativeLinear:
    """A weight format's kernel as C++ code calls it (kernels/csrc/layer_stack.cpp): `kind` 0 is
    float32 panels (panel_linear), 1 bf16 panels (bf16_panel_linear), 2 and 3 4-bit and 8-bit block
    records (q4_linear, q8_linear)."""
    kind: int
    packed: torch.Tensor
    bias: torch.Tensor | None


class LinearMethod(ABC):
    @abstractmethod
    def create_weights(self, layer: Linear, in_features: int, out_features: int, bias: bool) -> None: ...

    def load_weight(self, layer: Linear, name: str, tensor: torch.Tensor, rows: slice | None) -> None:
        """Copy a checkpoint tensor into parameter `name` (rows of it for a fused shard)."""
        param = getattr(layer, name)
        dst = param if rows is None else param[rows]
        if dst.shape != tensor.shape:
            raise ValueError(f"{layer.prefix}.{name}: checkpoint shape {tuple(tensor.shape)}, "
                             f"expected {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(tensor.to(param.dtype))

    def load(self, layer: Linear) -> None:
        """Every checkpoint tensor is in: repack or convert (default: nothing to do)."""

    @abstractmethod
    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...

    def apply_swiglu(self, layer: Linear, x: torch.Tensor, down: Linear) -> torch.Tensor | None:
        """silu(x W_gate) * (x W_up) for a gate/up layer (output_sizes [inter, inter]) whose result
        goes into `down`, in one fused pass; None (the default): this method has no such pass, the
        caller runs `apply` and then the element-wise op."""
        return None

    def apply_argmax(self, layer: Linear, x: torch.Tensor, n_valid: int) -> torch.Tensor | None:
        """argmax over the first n_valid columns of x Wᵀ (+ b) per row (int64 [rows], first index on
        ties), for greedy sampling without the logits; None (the default): no such pass here."""
        return None

    def native(self, layer: Linear) -> NativeLinear | None:
        """This layer's kernel for C++ callers, which then compute exactly what `apply` computes on
        float32 rows; None (the default): the format has no such kernel, callers use `apply`."""
        return None

    def swiglu_fusable(self, layer: Linear, down: Linear) -> bool:
        """Whether apply_swiglu fuses this gate/up layer with `down` for float32 rows."""
        return False


class Linear(nn.Module):
    """y = x Wᵀ + b with W [out, in]. `tied`: the weight is shared with another module (e.g. the
    embedding), so a method must keep the plain tensor."""

    def __init__(self, in_features: int, output_sizes: int | list[int], bias: bool = False,
                 quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        super().__init__()
        self.output_sizes = [output_sizes] if isinstance(output_sizes, int) else list(output_sizes)
        self.in_features, self.out_features = in_features, sum(self.output_sizes)
        self.prefix = prefix
        self.tied = False
        if quant_method is None:
            from tokenmill.quant.unquantized import PlainLinearMethod
            quant_method = PlainLinearMethod()
        self.quant_method = quant_method
        quant_method.create_weights(self, in_features, self.out_features, bias)

    def shard_rows(self, shard: int) -> slice:
        start = sum(self.output_sizes[:shard])
        return slice(start, start + self.output_sizes[shard])

    def load_weight(self, name: str, tensor: torch.Tensor, shard: int | None = None) -> None:
        self.quant_method.load_weight(self, name, tensor, None if shard is None else self.shard_rows(shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.output_sizes}, method={type(self.quant_method).__name__}"
