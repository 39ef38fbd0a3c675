"""Build a model from a Hugging Face safetensors folder (GGUF files are converted to one first, see
gguf_convert.py): the architecture's class from the registry, created on the meta device in the
model dtype, materialized, filled through its own `load_weights` hook, then each Linear's quant
method repacks its weight. A quant config may bring its own weight source (`iter_weights`: GGUF
blocks read from the .gguf itself) and a last pass over the model (`process_model`). Last, the
weights move into one huge-page arena (weight_arena.py)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from safetensors import safe_open
from tqdm import tqdm

from tokenmill import malloc
from tokenmill.models.base import CausalLM
from tokenmill.models.model_config import ModelConfig
from tokenmill.models.registry import get_model_class
from tokenmill.models.weight_arena import gather_weights
from tokenmill.quant import QuantConfig


def iter_safetensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(folder)!r}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in tqdm(list(f.keys()), desc=f"loading {file.name}", leave=False, disable=None):
                yield name, f.get_tensor(name)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _materialize(model: nn.Module) -> None:
    """Real (uninitialised) CPU storage for every meta parameter and buffer, as `to_empty` gives,
    through torch.empty: to_empty's empty_like on meta tensors runs torch._refs, whose first use
    imports torch.fx's symbolic shapes and sympy (~0.7 s of every start)."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_meta:
                module._parameters[name] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
        for name, b in module._buffers.items():
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype)


def build_model(cfg: ModelConfig, folder: str | Path, dtype: torch.dtype, max_positions: int,
                quant: QuantConfig | None = None) -> CausalLM:
    cls = get_model_class(cfg.architecture)
    quant = quant or QuantConfig(dtype)
    # bf16 panel weights keep float32 activations around them (quant/unquantized.py)
    with torch.device("meta"), _default_dtype(quant.activation_dtype):
        model = cls(cfg, max_positions, quant)
    _materialize(model)
    model.tie_weights()
    weights = quant.iter_weights(folder) if hasattr(quant, "iter_weights") else iter_safetensors(folder)
    loaded = model.load_weights(weights)
    _check_all_loaded(model, loaded)
    model = model.eval().requires_grad_(False)
    model.process_weights_after_loading()
    if hasattr(quant, "process_model"):
        quant.process_model(model)
    gather_weights(model)  # one huge-page arena: a decode step's weight stream misses the TLB 512x less
    malloc.release_free_memory()  # the float copies of repacked or quantized weights
    return model


def _check_all_loaded(model: CausalLM, loaded: set[str]) -> None:
    """Every parameter got a tensor (a tied parameter counts once, under any of its names)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ids = {id(params[name]) for name in loaded}
    missing = sorted(name for name, p in params.items() if id(p) not in loaded_ids)
    if missing:
        raise ValueError(f"weights missing for: {missing[:5]}")
