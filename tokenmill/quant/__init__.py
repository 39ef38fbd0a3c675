"""Weight formats as Linear quant methods (tokenmill/models/linear.py: LinearMethod).

`quant_config(quantization, dtype, gguf_file)` picks one per engine:
- "none": float weights in the model dtype (UnquantizedConfig; a .gguf is dequantized at load);
- "gguf": a .gguf file's Q4_0 / Q4_1 / Q8_0 blocks kept as they are (GGUFConfig);
- "int8" / "int4": float weights quantized at load, round to nearest (RTNConfig; int4 per group of
  `group_size` inputs);
- "awq" / "gptq": a folder whose config.json has AutoAWQ's / a GPTQ tool's `quantization_config`
  (CheckpointQuantConfig);
- "compressed-tensors": a folder in vLLM's native format (llm-compressor, W8A16 / W4A16;
  CompressedTensorsConfig).
"""
from __future__ import annotations

from pathlib import Path

import torch

from tokenmill.quant.unquantized import UnquantizedConfig

QUANTIZATIONS = ("none", "gguf", "int8", "int4", "awq", "gptq", "compressed-tensors")
CHECKPOINT_METHODS = ("awq", "gptq", "compressed-tensors")  # read from a folder's quantization_config


def quant_config(quantization: str, dtype: torch.dtype, gguf_file: str | Path | None = None, group_size: int = 32,
                 hf_quant_config: dict | None = None):
    if quantization == "none":
        return UnquantizedConfig(dtype)
    if quantization == "gguf":
        if gguf_file is None:
            raise ValueError("quantization='gguf' needs a .gguf model file")
        from tokenmill.quant.gguf import GGUFConfig
        return GGUFConfig(gguf_file, dtype)
    if quantization in ("int8", "int4"):
        from tokenmill.quant.rtn import RTNConfig
        return RTNConfig(int(quantization[3:]), dtype, group_size)
    if quantization in ("awq", "gptq"):
        from tokenmill.quant.checkpoint import CheckpointQuantConfig
        return CheckpointQuantConfig(hf_quant_config or {"quant_method": quantization}, dtype)
    if quantization == "compressed-tensors":
        if not hf_quant_config:
            raise ValueError("quantization='compressed-tensors' needs a folder whose config.json has its "
                             "quantization_config")
        from tokenmill.quant.compressed_tensors import CompressedTensorsConfig
        return CompressedTensorsConfig(hf_quant_config, dtype)
    raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")


QuantConfig = UnquantizedConfig  # the default when a caller names none

__all__ = ["CHECKPOINT_METHODS", "QUANTIZATIONS", "QuantConfig", "UnquantizedConfig", "quant_config"]
