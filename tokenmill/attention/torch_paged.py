"""Paged attention on CPU with PyTorch SDPA, batched over sequences.

Sequences are split into two groups, decodes (1 query token) and prefill chunks (>1), so a long
chunk does not pad every decode to its length. Within a group, queries and the cached context are
gathered into padded [B, ...] views by index tensors computed once per step and reused by every
layer."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tokenmill.attention.backend import AttentionBackend, BatchLayout
from tokenmill.attention.kv_cache import gather_blocks, write_kv


@dataclass
class _Group:
    q_index: torch.Tensor    # [B, Q] flat token index; padding points at row T (a zero row)
    out_index: torch.Tensor  # [N] flat token index of each real query, in padded order
    out_valid: torch.Tensor  # [N] position of each real query in the flattened [B*Q] output
    block_table: torch.Tensor  # [B, NB] block ids (padding: block 0, masked out)
    mask: torch.Tensor       # [B, 1, Q, L] True where attention is allowed
    abs_pos: torch.Tensor    # [B, Q] absolute position of each query
    window_masks: dict = field(default_factory=dict)  # sliding window -> its [B, 1, Q, L] mask

    def mask_for(self, sliding_window: int | None) -> torch.Tensor:
        if not sliding_window:
            return self.mask
        if sliding_window not in self.window_masks:
            keys = torch.arange(self.mask.shape[-1])
            inside = keys[None, None, :] > self.abs_pos[:, :, None] - sliding_window
            self.window_masks[sliding_window] = self.mask & inside[:, None]
        return self.window_masks[sliding_window]


@dataclass
class TorchPagedMetadata:
    slot_mapping: torch.Tensor
    num_tokens: int
    block_size: int
    groups: list[_Group]
    layout: BatchLayout


class TorchPagedBackend(AttentionBackend):
    name = "torch"

    def build_metadata(self, layout: BatchLayout) -> TorchPagedMetadata:
        qsl = layout.query_start_loc
        q_lens = [qsl[b + 1] - qsl[b] for b in range(len(layout.seq_lens))]
        decode = [b for b, n in enumerate(q_lens) if n == 1]
        prefill = [b for b, n in enumerate(q_lens) if n > 1]
        groups = [_build_group(layout, idx, q_lens) for idx in (decode, prefill) if idx]
        return TorchPagedMetadata(layout.slot_mapping, qsl[-1], layout.block_size, groups, layout)

    def forward(self, q, k, v, kv_cache, meta: TorchPagedMetadata, scale: float, sliding_window: int | None = None
                ) -> torch.Tensor:
        write_kv(kv_cache, k, v, meta.slot_mapping)
        q_pad = torch.cat([q, q.new_zeros(1, q.shape[1], q.shape[2])])
        out = q.new_empty(q.shape)
        for g in meta.groups:
            attend_group(q_pad, kv_cache, g, meta.block_size, scale, out, sliding_window)
        return out


def attend_group(q_pad: torch.Tensor, kv_cache: tuple[torch.Tensor, ...], g: _Group, block_size: int,
                 scale: float, out: torch.Tensor, sliding_window: int | None = None) -> None:
    """SDPA over a padded copy of the group's queries and gathered context; writes rows of `out`."""
    num_heads, head_dim = q_pad.shape[1], q_pad.shape[2]
    qg = q_pad[g.q_index].transpose(1, 2)                       # [B, H, Q, D]
    # gather whole blocks (one contiguous copy per block, not per token), dequantized
    kg, vg = gather_blocks(kv_cache, g.block_table, block_size, q_pad.dtype)
    kg, vg = kg.transpose(1, 2), vg.transpose(1, 2)                # [B, Hkv, L, D]
    og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask_for(sliding_window), scale=scale, enable_gqa=True)
    og = og.transpose(1, 2).reshape(-1, num_heads, head_dim)    # [B*Q, H, D]
    out.index_copy_(0, g.out_index, og.index_select(0, g.out_valid))


def _build_group(layout: BatchLayout, seqs: list[int], q_lens: list[int]) -> _Group:
    bs = layout.block_size
    max_q = max(q_lens[b] for b in seqs)
    max_len = max(layout.seq_lens[b] for b in seqs)
    max_blocks = -(-max_len // bs)
    num_tokens = layout.query_start_loc[-1]
    n = len(seqs)
    starts = torch.tensor([layout.query_start_loc[b] for b in seqs])
    qlen = torch.tensor([q_lens[b] for b in seqs])
    seq_len = torch.tensor([layout.seq_lens[b] for b in seqs])
    qpos = torch.arange(max_q)
    real_q = qpos[None, :] < qlen[:, None]                                    # [B, Q]
    q_index = torch.where(real_q, starts[:, None] + qpos[None, :], num_tokens)
    tables = torch.zeros(n, max_blocks, dtype=torch.long)
    for i, b in enumerate(seqs):
        row = layout.block_tables[b][:max_blocks]
        tables[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    # Absolute position of each query; padded queries sit at 0 so their rows are never empty.
    abs_pos = torch.where(real_q, seq_len[:, None] - qlen[:, None] + qpos[None, :], 0)
    mask = torch.arange(max_blocks * bs)[None, None, :] <= abs_pos[:, :, None]  # [B, Q, NB*bs]
    flat_valid = real_q.reshape(-1).nonzero().squeeze(1)
    return _Group(q_index=q_index, out_index=q_index.reshape(-1)[flat_valid], out_valid=flat_valid,
                  block_table=tables, mask=mask[:, None], abs_pos=abs_pos)
