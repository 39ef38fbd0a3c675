"""`quantization="int8"` / `"int4"`: float checkpoints quantized at load, weight-only, round to
nearest — int8 with one scale per output channel, int4 asymmetric per group of `group_size` inputs
(32, 64 or 128). The linear layers then run on the same block records and kernels as GGUF's blocks
(quant/blocks.py); the LM head (and the embedding) keep the model dtype, as vLLM's weight-only
formats do: the head sets every logit, and the embedding is read a row at a time.
"""
from __future__ import annotations

from functools import partial

import torch

from tokenmill.models.linear import LinearMethod
from tokenmill.quant.blocks import BlockLinearMethod, quantize_int4, quantize_int8_per_channel
from tokenmill.quant.unquantized import UnquantizedConfig

GROUP_SIZES = (32, 64, 128)


class RTNConfig:
    def __init__(self, bits: int, dtype: torch.dtype, group_size: int = 32) -> None:
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        if group_size not in GROUP_SIZES:
            raise ValueError(f"quant_group_size must be one of {', '.join(map(str, GROUP_SIZES))}; got {group_size}")
        self.name = f"int{bits}"
        self.bits, self.group_size = bits, group_size
        # our kernels take float32 activations; a float16 head would not
        self.head = UnquantizedConfig(torch.float32 if dtype == torch.float16 else dtype)
        self.quantize = quantize_int8_per_channel if bits == 8 else partial(quantize_int4, group=group_size)

    @property
    def activation_dtype(self) -> torch.dtype:
        return torch.float32

    def get_linear_method(self, prefix: str) -> LinearMethod:
        if prefix == "lm_head" or prefix.endswith(".lm_head"):
            return self.head.get_linear_method(prefix)
        return BlockLinearMethod(self.quantize)
