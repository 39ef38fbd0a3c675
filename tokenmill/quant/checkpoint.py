"""`quantization="awq"` / `"gptq"`: folders whose config.json carries a `quantization_config` made by
AutoAWQ (GEMM layout) or a GPTQ tool, read into our block records (tensor layouts in awq_gptq.py)
and run on the same kernels as GGUF's blocks. The LM head and embedding stay in the model dtype
(those checkpoints keep them unquantized).

Each layer's per-parameter loader collects a shard's tensors (qweight, qzeros, scales, and g_idx for
GPTQ); once a shard has all of them it becomes `BlockQuantized` codes. GPTQ with act-order reads its
inputs through a permutation (`layer.input_perm`); shards of one fused layer with different
permutations are requantized to 8 bits in the original input order instead.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tokenmill.models.linear import Linear, LinearMethod, NativeLinear
from tokenmill.quant.awq_gptq import read_awq_linear, read_gptq_linear
from tokenmill.quant.blocks import BlockLinearMethod, BlockQuantized, quantize_q8
from tokenmill.quant.unquantized import UnquantizedConfig

_TENSORS = {"awq": ("qweight", "qzeros", "scales"), "gptq": ("qweight", "qzeros", "scales", "g_idx")}


class CheckpointQuantConfig:
    def __init__(self, hf_quant_config: dict, dtype: torch.dtype) -> None:
        method = str(hf_quant_config.get("quant_method", "")).lower()
        if method not in _TENSORS:
            raise ValueError(f"quantization_config.quant_method must be awq or gptq; got {method!r}")
        bits = int(hf_quant_config.get("bits", hf_quant_config.get("w_bit", 4)))
        if bits != 4:
            raise ValueError(f"quantization_config.bits: only 4-bit {method} checkpoints are supported, got {bits}")
        if method == "awq" and str(hf_quant_config.get("version", "gemm")).lower() != "gemm":
            raise ValueError("quantization_config.version: only AutoAWQ's gemm layout is supported, got "
                             f"{hf_quant_config.get('version')!r}")
        self.name = method
        self.group_size = int(hf_quant_config.get("group_size", hf_quant_config.get("q_group_size", 128)))
        # GPTQ version-1 checkpoints store zero - 1 (the common case; "checkpoint_format": "gptq_v2" does not)
        self.zero_offset = 0 if hf_quant_config.get("checkpoint_format") == "gptq_v2" else 1
        self.not_converted = tuple(hf_quant_config.get("modules_to_not_convert") or ())
        self.head = UnquantizedConfig(torch.float32 if dtype == torch.float16 else dtype)

    @property
    def activation_dtype(self) -> torch.dtype:
        return torch.float32

    def get_linear_method(self, prefix: str) -> LinearMethod:
        if prefix == "lm_head" or prefix.endswith(".lm_head") or any(m in prefix for m in self.not_converted):
            return self.head.get_linear_method(prefix)
        return CheckpointBlockMethod(_TENSORS[self.name], self.read)

    def read(self, t: dict[str, torch.Tensor]) -> tuple[BlockQuantized, torch.Tensor | None]:
        if self.name == "awq":
            return read_awq_linear(t["qweight"], t["qzeros"], t["scales"], self.group_size), None
        return read_gptq_linear(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], self.group_size, self.zero_offset)


class CheckpointBlockMethod(BlockLinearMethod):
    """A layer whose checkpoint holds `tensor_names` per shard; `read` turns one shard's tensors into
    (blocks, the input permutation or None)."""

    def __init__(self, tensor_names: tuple[str, ...],
                 read: Callable[[dict[str, torch.Tensor]], tuple[BlockQuantized, torch.Tensor | None]]) -> None:
        super().__init__()
        self.tensor_names, self.read = tensor_names, read

    def create_weights(self, layer: Linear, in_features: int, out_features: int, bias: bool) -> None:
        layer.weight = torch.empty(out_features, in_features, device="meta")  # shape only, not a parameter
        layer.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None
        for name in self.tensor_names:  # what the checkpoint holds; filled per shard
            setattr(layer, name, nn.Parameter(torch.empty(0), requires_grad=False))
        layer.shards, layer.pending, layer.input_perm = [], {}, None

    def load_weight(self, layer: Linear, name: str, tensor, rows: slice | None) -> None:
        if name not in self.tensor_names:
            return LinearMethod.load_weight(self, layer, name, tensor, rows)
        rows = rows or slice(0, layer.out_features)
        parts = layer.pending.setdefault((rows.start, rows.stop), {})
        parts[name] = tensor
        if len(parts) == len(self.tensor_names):
            del layer.pending[(rows.start, rows.stop)]
            blocks, perm = self.read(parts)
            expected = (rows.stop - rows.start, layer.in_features)
            if tuple(blocks.shape) != expected:
                raise ValueError(f"{layer.prefix}: checkpoint shape {tuple(blocks.shape)}, expected {expected}")
            layer.shards.append((rows, blocks, perm))

    def load(self, layer: Linear) -> None:
        if layer.pending:
            raise ValueError(f"{layer.prefix}: incomplete checkpoint tensors for rows {sorted(layer.pending)} "
                             f"(needs {', '.join(self.tensor_names)})")
        perms = [p for _, _, p in layer.shards]
        if all(p is None for p in perms) or all(p is not None and torch.equal(p, perms[0]) for p in perms):
            layer.input_perm = perms[0]
            layer.shards = [(rows, blocks) for rows, blocks, _ in layer.shards]
        else:  # shards permuted differently: back to the original input order, 8 bits per 32
            layer.shards = [(rows, quantize_q8(_unpermute(blocks.dequantize(), perm)))
                            for rows, blocks, perm in layer.shards]
        for name in self.tensor_names:
            setattr(layer, name, None)
        if "weight" in self.tensor_names:  # a checkpoint's int8 `weight`: back to the shape-only placeholder
            layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features, device="meta"),
                                        requires_grad=False)
        super().load(layer)

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.input_perm is not None:
            x = x.index_select(-1, layer.input_perm)
        return super().apply(layer, x)

    def native(self, layer: Linear) -> NativeLinear | None:
        return None if layer.input_perm is not None else super().native(layer)  # C++ callers do not permute

    def apply_argmax(self, layer: Linear, x: torch.Tensor, n_valid: int) -> torch.Tensor | None:
        return None if layer.input_perm is not None else super().apply_argmax(layer, x, n_valid)


def _unpermute(w_permuted: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    if perm is None:
        return w_permuted
    w = torch.empty_like(w_permuted)
    w[:, perm] = w_permuted
    return w
