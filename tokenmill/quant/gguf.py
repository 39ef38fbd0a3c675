"""`quantization="gguf"`: a .gguf model's Q4_0 / Q4_1 / Q8_0 tensors stay quantized.

The weights are read from the .gguf file itself (memory-mapped; its tensor table cached by
models/gguf_index.py, so a start does not parse the vocabulary again): quantized
tensors reach the layers as `BlockQuantized` codes (quant/blocks.py), everything else (norms,
biases, tensor types we do not keep) as float32 through the same name mapping and Q/K row
un-permutation as the float conversion (models/gguf_tensors.py), so both paths load the same
model. Stacked MoE experts arrive one expert at a time, still as blocks; routers, gates and MLA's
kv_b always as float. Every Linear computes on block records (F32/F16 tensors stay float, block types we do not compute on become 8-bit blocks); the embedding table becomes a `BlockEmbedding`
sharing the LM head's records when the two are tied (the default model: one Q8_0 table, 30 MB,
where float32 took 113 MB). Activations stay float32 around the kernels; the KV cache keeps the
model dtype.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear, LinearMethod
from tokenmill.quant.blocks import GGUF_NATIVE_TYPES, BlockEmbedding, BlockLinearMethod, BlockQuantized, \
    from_gguf_blocks, pack, quantize_q8

logger = logging.getLogger(__name__)


_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


class GGUFConfig:
    name = "gguf"

    def __init__(self, gguf_file: str | Path, dtype: torch.dtype) -> None:
        self.gguf_file = Path(gguf_file)
        self.dtype = dtype

    @property
    def activation_dtype(self) -> torch.dtype:
        return torch.float32

    def get_linear_method(self, prefix: str) -> LinearMethod:
        return BlockLinearMethod()

    def iter_weights(self, folder: str | Path) -> Iterator[tuple[str, torch.Tensor | BlockQuantized]]:
        yield from iter_gguf_weights(self.gguf_file)

    def process_model(self, model: nn.Module) -> None:
        """After loading: embedding tables become block records (shared with a tied LM head)."""
        if not cpu_ops.load():
            return
        tied = {id(m.tied_source): m for m in model.modules() if getattr(m, "tied_source", None) is not None}
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if isinstance(child, nn.Embedding):
                    setattr(parent, child_name, self._block_embedding(child, tied.get(id(child.weight))))
        for m in tied.values():
            del m.tied_source

    def _block_embedding(self, emb: nn.Embedding, tied: Linear | None) -> nn.Module:
        if emb.embedding_dim % 32:  # not in blocks of 32: stays as it is
            return emb
        if tied is not None and getattr(tied, "records", None) is not None:
            records, bits = tied.records, tied.bits
        else:
            records, bits = pack(quantize_q8(emb.weight.detach())), 8
        return BlockEmbedding(records, bits, emb.num_embeddings, emb.embedding_dim, emb.weight.dtype)


def iter_gguf_weights(path: Path) -> Iterator[tuple[str, torch.Tensor | BlockQuantized]]:
    from tokenmill.models.gguf_arch import build_hf_config, check_architecture
    from tokenmill.models.gguf_convert import gguf_index
    from tokenmill.models.gguf_tensors import iter_hf_tensors

    index = gguf_index(path)  # the file's fields and tensor table, without parsing its vocabulary again
    meta = index.metadata
    arch = check_architecture(meta.get("general.architecture"), repr(str(path)))
    config = build_hf_config(arch, meta, {t.name: list(t.shape) for t in index.tensors})
    kept: dict[str, int] = {}
    for t in iter_hf_tensors(index, arch, config, keep_blocks=GGUF_NATIVE_TYPES):
        if t.block_type is not None:  # rows of Q4_0 / Q4_1 / Q8_0 blocks (experts: one expert's rows)
            kept[t.block_type] = kept.get(t.block_type, 0) + 1
            yield t.name, from_gguf_blocks(t.data, t.block_type, t.data.shape[0], t.cols)
            continue
        w = torch.from_numpy(t.data)
        if t.source_type not in _FLOAT_TYPES and not t.plain and w.dim() == 2 and w.shape[1] % 32 == 0:
            key = f"Q8_0 (from {t.source_type})"
            kept[key] = kept.get(key, 0) + 1
            yield t.name, quantize_q8(w)  # a block type we do not compute on: 8 bits per 32
        else:
            yield t.name, w
    logger.info("GGUF weights kept quantized: %s", ", ".join(f"{v} x {k}" for k, v in sorted(kept.items())) or "none")
