"""`quantization="compressed-tensors"`: folders in the format vLLM reads natively, written by
llm-compressor / the `compressed-tensors` library or by `tokenmill quantize --format
compressed-tensors`, read into our block records and run on the same kernels as GGUF's blocks.

Weight-only integer schemes (W8A16, W4A16): 4 or 8 bits, symmetric or with zero points, one scale
per output channel or per group of a multiple of 32 inputs. Per linear, by `format`:
  pack-quantized            weight_packed int32 [out, in*bits/32] (element i at bit i*bits of the
                            row), weight_scale [out, groups], weight_shape [2], and for asymmetric
                            schemes weight_zero_point packed along the output dimension
  int-quantized / naive-quantized   weight int8 [out, in], weight_scale, weight_zero_point
The integers q are signed (4 bits: -8..7); w = (q - zero) * scale. In our records' terms (4 bits)
code = q + 8, d = scale, m = -(8 + zero) * scale per 32-input block. 8-bit codes with zero points,
and groups that are not a multiple of 32, are requantized to symmetric 8 bits per 32 inputs.

The library's own packing helpers read the tensors; anything outside these schemes (float8,
activation quantization, act-order, sparsity) is an error naming its config field.
"""
from __future__ import annotations

import re

import torch

from tokenmill.models.linear import LinearMethod
from tokenmill.quant.blocks import BLOCK, BlockQuantized, quantize_q8
from tokenmill.quant.checkpoint import CheckpointBlockMethod
from tokenmill.quant.unquantized import UnquantizedConfig

NAME = "compressed-tensors"
PACKED_FORMATS = ("pack-quantized",)
INT_FORMATS = ("int-quantized", "naive-quantized")
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class WeightScheme:
    """One config group's `weights` arguments, checked."""

    def __init__(self, where: str, args: dict, fmt: str) -> None:
        self.where = where
        if str(args.get("type", "int")) != "int":
            raise ValueError(f"{where}.type: only integer weights are supported, got {args.get('type')!r}")
        self.bits = int(args.get("num_bits", 8))
        if self.bits not in (4, 8):
            raise ValueError(f"{where}.num_bits must be 4 or 8, got {self.bits}")
        self.strategy = str(args.get("strategy", "channel"))
        if self.strategy not in ("channel", "group"):
            raise ValueError(f"{where}.strategy must be channel or group, got {self.strategy!r}")
        self.group_size = int(args["group_size"]) if self.strategy == "group" else None
        if args.get("actorder") not in (None, "static"):
            raise ValueError(f"{where}.actorder {args.get('actorder')!r} is not supported (None or static)")
        if args.get("dynamic"):
            raise ValueError(f"{where}.dynamic: weights must have static scales")
        self.symmetric = bool(args.get("symmetric", True))
        if fmt not in PACKED_FORMATS + INT_FORMATS:
            raise ValueError(f"quantization_config.format must be one of "
                             f"{', '.join(PACKED_FORMATS + INT_FORMATS)}; got {fmt!r}")
        if fmt in INT_FORMATS and self.bits != 8:
            raise ValueError(f"{where}.num_bits: {fmt} stores 8-bit weights, got {self.bits}")
        self.format = fmt

    @property
    def tensor_names(self) -> tuple[str, ...]:
        names = ("weight_packed", "weight_scale", "weight_shape") if self.format in PACKED_FORMATS \
            else ("weight", "weight_scale")
        return names if self.symmetric else (*names, "weight_zero_point")

    def read(self, t: dict[str, torch.Tensor]) -> tuple[BlockQuantized, None]:
        scale = t["weight_scale"].float()
        if self.format in PACKED_FORMATS:
            from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
            shape = torch.Size(int(v) for v in t["weight_shape"].tolist())
            q = unpack_from_int32(t["weight_packed"], self.bits, shape)
            zero = None if self.symmetric else unpack_from_int32(t["weight_zero_point"], self.bits, scale.shape,
                                                                 packed_dim=0)
        else:
            q, zero = t["weight"], t.get("weight_zero_point")
        return to_blocks(q, scale, None if zero is None else zero.float(), self.bits, self.group_size), None


def to_blocks(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int,
              group: int | None) -> BlockQuantized:
    """Signed integers q [out, in], scale and zero [out, in/group] (group None: one per row) -> blocks."""
    n, k = q.shape
    if k % BLOCK:
        raise ValueError(f"compressed-tensors weights need in_features divisible by {BLOCK}, got {k}")
    group = group or k
    if scale.shape != (n, k // group):
        raise ValueError(f"weight_scale shape {tuple(scale.shape)}, expected {(n, k // group)}")
    if group % BLOCK or (bits == 8 and zero is not None and bool(zero.any())):
        w = (q.float() - (0 if zero is None else zero.repeat_interleave(group, 1))) * scale.repeat_interleave(group, 1)
        return quantize_q8(w)
    d = scale.repeat_interleave(group // BLOCK, 1).contiguous()
    if bits == 8:
        return BlockQuantized(q.to(torch.int8).contiguous(), d, None, 8)
    offset = 8 + (0 if zero is None else zero.repeat_interleave(group // BLOCK, 1))
    return BlockQuantized((q.to(torch.int16) + 8).to(torch.uint8).contiguous(), d, -offset * d, 4)


class CompressedTensorsConfig:
    def __init__(self, hf_quant_config: dict, dtype: torch.dtype) -> None:
        qc = hf_quant_config
        self.name = NAME
        status = qc.get("quantization_status", "compressed")
        if status != "compressed":
            raise ValueError(f"quantization_config.quantization_status must be 'compressed', got {status!r}")
        if qc.get("sparsity_config"):
            raise ValueError("quantization_config.sparsity_config: sparse checkpoints are not supported")
        fmt = str(qc.get("format", ""))
        self.groups: list[tuple[list[str], WeightScheme]] = []
        for key, group in (qc.get("config_groups") or {}).items():
            where = f"quantization_config.config_groups.{key}"
            if group.get("input_activations") or group.get("output_activations"):
                raise ValueError(f"{where}.input_activations: activation quantization is not supported "
                                 "(weight-only schemes, W8A16 / W4A16, are)")
            if not group.get("weights"):
                raise ValueError(f"{where}.weights is missing")
            self.groups.append((list(group.get("targets") or []), WeightScheme(f"{where}.weights", group["weights"],
                                                                               group.get("format") or fmt)))
        if not self.groups:
            raise ValueError("quantization_config.config_groups is empty")
        self.ignore = list(qc.get("ignore") or [])
        self.head = UnquantizedConfig(torch.float32 if dtype == torch.float16 else dtype)

    @property
    def activation_dtype(self) -> torch.dtype:
        return torch.float32

    def get_linear_method(self, prefix: str) -> LinearMethod:
        # a fused layer (qkv_proj) is its checkpoint modules (q_proj, k_proj, v_proj): one scheme for all
        base, _, leaf = prefix.rpartition(".")
        names = [f"{base}.{s}" if base else s for s in _FUSED.get(leaf, (leaf,))]
        schemes = {id(s): s for s in map(self._scheme, names)}
        if len(schemes) > 1:
            raise ValueError(f"{prefix}: its modules {', '.join(names)} have different quantization schemes")
        scheme = next(iter(schemes.values()))
        if scheme is None:  # ignored or in no group: the checkpoint holds it in float
            return self.head.get_linear_method(prefix)
        return CheckpointBlockMethod(scheme.tensor_names, scheme.read)

    def _scheme(self, name: str) -> WeightScheme | None:
        if any(_matches(t, name) for t in self.ignore):
            return None
        return next((s for targets, s in self.groups if any(_matches(t, name) for t in targets)), None)


def _matches(target: str, prefix: str) -> bool:
    """compressed-tensors' targets: a module class ("Linear"), "re:<regex>", or a module name."""
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], prefix) is not None
    return prefix == target or prefix.endswith("." + target)


# -- writing (tokenmill quantize --format compressed-tensors) --------------------------------------
def writer_scheme(bits: int, group: int | None):
    """int8: symmetric, one scale per output channel (W8A16); int4: asymmetric per group (W4A16)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel") if bits == 8 else \
        QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=group)
    return QuantizationScheme(targets=["Linear"], weights=args)


def compress_linear(w: torch.Tensor, scheme) -> dict[str, torch.Tensor]:
    """A float weight [out, in] -> the checkpoint tensors of `scheme`, by the library's own min/max
    rounding and packing (what llm-compressor's round-to-nearest writes)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams
    a = scheme.weights
    n, k = w.shape
    size = k if a.strategy == "channel" else a.group_size
    if k % size:
        raise ValueError(f"in_features {k} must be divisible by group_size {size}")
    g = w.float().reshape(n, k // size, size)
    scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), a)
    fmt = "int-quantized" if a.num_bits == 8 else "pack-quantized"
    state = {"weight": w.float(), "weight_scale": scale.half(), "weight_zero_point": zero}
    return BaseCompressor.load_from_registry(fmt).compress(state, scheme)


def write_config(folder, scheme) -> None:
    """Add compressed-tensors' quantization_config to folder/config.json (the library writes it)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig
    fmt = "int-quantized" if scheme.weights.num_bits == 8 else "pack-quantized"
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                                ignore=["lm_head"])
    ModelCompressor(quantization_config=config).update_config(str(folder))
