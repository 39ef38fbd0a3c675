"""Slow, obviously-correct attention: one sequence at a time, explicit causal softmax. Tests only."""
from __future__ import annotations

import torch

from tokenmill.attention.backend import AttentionBackend, BatchLayout, context_slots
from tokenmill.attention.kv_cache import gather_slots, write_kv


class ReferenceBackend(AttentionBackend):
    name = "reference"

    def build_metadata(self, layout: BatchLayout) -> BatchLayout:
        return layout

    def forward(self, q, k, v, kv_cache, meta: BatchLayout, scale: float, sliding_window: int | None = None
                ) -> torch.Tensor:
        write_kv(kv_cache, k, v, meta.slot_mapping)
        out = torch.empty_like(q)
        groups = q.shape[1] // kv_cache[0].shape[1]
        for b, seq_len in enumerate(meta.seq_lens):
            start, end = meta.query_start_loc[b], meta.query_start_loc[b + 1]
            slots = context_slots(meta.block_tables[b], seq_len, meta.block_size)
            keys, values = gather_slots(kv_cache, slots)  # [L, Hkv, D] float32, dequantized
            keys = keys.repeat_interleave(groups, dim=1)    # [L, H, D]
            values = values.repeat_interleave(groups, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * scale
            q_pos = torch.arange(seq_len - (end - start), seq_len)
            mask = torch.arange(seq_len)[None, :] > q_pos[:, None]
            if sliding_window:
                mask |= torch.arange(seq_len)[None, :] <= q_pos[:, None] - sliding_window
            scores.masked_fill_(mask, float("-inf"))
            out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(q.dtype)
        return out
