"""CPU paged attention: decodes through our C++ kernel, which reads K/V in place from the paged cache
(tokenmill/attention/csrc/paged_decode.cpp); prefill chunks through SDPA as in the torch backend.

Why: the torch backend copies every decode's whole context into a padded [B, L, Hkv, D] tensor per
layer before SDPA reads it again; at batch 64 x 272 tokens that copy was a third of the step
(docs/BENCHMARKS.md). The kernel reads each K/V row once and writes nothing but the output."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenmill.attention import cpu_ops
from tokenmill.attention.backend import BatchLayout
from tokenmill.attention.kv_cache import write_kv
from tokenmill.attention.torch_paged import TorchPagedBackend, _build_group, _Group, attend_group


@dataclass
class _Decodes:
    rows: torch.Tensor | None   # [Bd] flat token index of each decode; None when every token is one
    block_table: torch.Tensor   # [Bd, NB] int64
    seq_lens: torch.Tensor      # [Bd] int64


@dataclass
class CpuPagedMetadata:
    slot_mapping: torch.Tensor
    block_size: int
    decodes: _Decodes | None
    prefills: _Group | None


class CpuPagedBackend(TorchPagedBackend):
    name = "cpu"

    def __init__(self) -> None:
        if not cpu_ops.load():
            raise RuntimeError("attention_backend='cpu' needs the C++ kernels, which could not be built here "
                               "(see the warning above); use attention_backend='torch'")

    def build_metadata(self, layout: BatchLayout) -> CpuPagedMetadata:
        qsl = layout.query_start_loc
        q_lens = [qsl[b + 1] - qsl[b] for b in range(len(layout.seq_lens))]
        decode = [b for b, n in enumerate(q_lens) if n == 1]
        prefill = [b for b, n in enumerate(q_lens) if n > 1]
        return CpuPagedMetadata(layout.slot_mapping, layout.block_size,
                                _build_decodes(layout, decode, all_decode=not prefill) if decode else None,
                                _build_group(layout, prefill, q_lens) if prefill else None)

    def forward(self, q, k, v, kv_cache, meta: CpuPagedMetadata, scale: float) -> torch.Tensor:
        write_kv(kv_cache, k, v, meta.slot_mapping)
        d = meta.decodes
        if meta.prefills is None and d is not None and d.rows is None:  # a pure decode step: no copies at all
            return cpu_ops.paged_decode(q, kv_cache, d.block_table, d.seq_lens, meta.block_size, scale)
        out = q.new_empty(q.shape)
        if d is not None:
            out[d.rows] = cpu_ops.paged_decode(q[d.rows], kv_cache, d.block_table, d.seq_lens, meta.block_size,
                                               scale)
        if meta.prefills is not None:
            q_pad = torch.cat([q, q.new_zeros(1, q.shape[1], q.shape[2])])
            attend_group(q_pad, kv_cache, meta.prefills, meta.block_size, scale, out)
        return out


def _build_decodes(layout: BatchLayout, seqs: list[int], all_decode: bool) -> _Decodes:
    max_blocks = max(len(layout.block_tables[b]) for b in seqs)
    tables = torch.zeros(len(seqs), max_blocks, dtype=torch.long)
    for i, b in enumerate(seqs):
        row = layout.block_tables[b]
        tables[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    rows = None if all_decode else torch.tensor([layout.query_start_loc[b] for b in seqs])
    return _Decodes(rows, tables, torch.tensor([layout.seq_lens[b] for b in seqs], dtype=torch.long))
