"""Multi-head latent attention (DeepSeek-V2/V3) over a paged cache of latents.

The cache holds, per token and layer, one row of kv_lora_rank + qk_rope_head_dim values: the
normalized KV latent c and the RoPE'd key k_pe shared by every head (576 values for DeepSeek-V3,
against 2 x 128 heads x 192/128 for decompressed K/V). `MLAKVCacheSpec` states that size to the
engine, so block counts, admission and prefix caching follow from it.

- Decode (one query per sequence) runs in the absorbed form: each head's query is projected into
  latent space through the key half of kv_b_proj (q_lat = q_nope W_UK), so scores are
  [q_lat, q_pe] · [c, k_pe] against the cached rows as they are — one shared KV "head" of width
  L + R (multi-query attention); the weighted sum of latents comes out per head and the value
  half of kv_b_proj (W_UV) is applied after attention. With our C++ kernels this is the paged
  decode kernel reading the cache in place (rows of L + R serve as K and, their first L values,
  as V); else SDPA over gathered blocks.
- Prefill chunks decompress: the context's latents go through kv_b_proj into per-head K (nope
  part) and V, and attend with SDPA (causal, offset by the cached context).

`DecompressedKVCacheSpec` + `attend_decompressed` are the baseline the benchmark compares with:
the same model caching per-head K (nope + rope) and V instead of the latent.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from tokenmill.attention.backend import BatchLayout
from tokenmill.attention.kv_cache import _elem, zeros
from tokenmill.kernels import cpu_ops


@dataclass(frozen=True)
class MLAKVCacheSpec:
    """Per layer: one row of `width` = kv_lora_rank + qk_rope_head_dim values per token."""
    num_blocks: int
    block_size: int
    width: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.width * _elem(self.dtype)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    def with_num_blocks(self, num_blocks: int) -> MLAKVCacheSpec:
        return replace(self, num_blocks=num_blocks)

    def allocate(self) -> tuple[torch.Tensor, ...]:
        return (zeros((self.num_blocks * self.block_size, 1, self.width), self.dtype),)


@dataclass(frozen=True)
class DecompressedKVCacheSpec:
    """The baseline: per-head K (qk_nope + qk_rope) and V (v_head_dim) per token and layer."""
    num_blocks: int
    block_size: int
    num_heads: int
    k_dim: int
    v_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.num_heads * (self.k_dim + self.v_dim) * _elem(self.dtype)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    def with_num_blocks(self, num_blocks: int) -> DecompressedKVCacheSpec:
        return replace(self, num_blocks=num_blocks)

    def allocate(self) -> tuple[torch.Tensor, ...]:
        slots = self.num_blocks * self.block_size
        return (zeros((slots, self.num_heads, self.k_dim), self.dtype),
                zeros((slots, self.num_heads, self.v_dim), self.dtype))


@dataclass
class _Prefill:
    start: int                # flat rows [start, end) of the chunk
    end: int
    context: int              # tokens cached before the chunk
    slots: torch.Tensor       # [context + end - start] slots of the whole sequence so far


@dataclass
class MLAMetadata:
    """Built once per step from the flat batch; shared by every MLA layer."""
    slot_mapping: torch.Tensor
    block_size: int
    decode_rows: torch.Tensor | None  # [Bd] flat rows of one-token sequences
    block_table: torch.Tensor | None  # [Bd, NB]
    seq_lens: torch.Tensor | None     # [Bd]
    prefills: list[_Prefill]
    use_kernel: bool                  # decode through our paged kernel (attention_backend cpu)

    @classmethod
    def build(cls, layout: BatchLayout, use_kernel: bool) -> MLAMetadata:
        qsl, bs = layout.query_start_loc, layout.block_size
        decodes, prefills = [], []
        for b, seq_len in enumerate(layout.seq_lens):
            n = qsl[b + 1] - qsl[b]
            if n == 1:
                decodes.append(b)
            else:
                blocks = torch.tensor(layout.block_tables[b][: -(-seq_len // bs)], dtype=torch.long)
                slots = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)[:seq_len]
                prefills.append(_Prefill(qsl[b], qsl[b + 1], seq_len - n, slots))
        rows = table = lens = None
        if decodes:
            rows = torch.tensor([qsl[b] for b in decodes])
            width = max(len(layout.block_tables[b]) for b in decodes)
            table = torch.zeros(len(decodes), width, dtype=torch.long)
            for i, b in enumerate(decodes):
                table[i, :len(layout.block_tables[b])] = torch.tensor(layout.block_tables[b], dtype=torch.long)
            lens = torch.tensor([layout.seq_lens[b] for b in decodes], dtype=torch.long)
        return cls(layout.slot_mapping, bs, rows, table, lens, prefills, use_kernel)


def absorbed_decode(q_lat: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, meta: MLAMetadata,
                    scale: float) -> torch.Tensor:
    """q_lat [Bd, H, L], q_pe [Bd, H, R] against cached rows [slots, 1, L + R] -> latent outputs
    [Bd, H, L] (softmax-weighted sums of the cached latents)."""
    latent = q_lat.shape[-1]
    q = torch.cat([q_lat, q_pe], dim=-1)
    if meta.use_kernel and cache.dtype in (torch.float32, torch.bfloat16) and cpu_ops.load():
        # K and V are the same rows; the last R output values (weights x k_pe) are dropped
        out = cpu_ops.paged_decode(q, (cache, cache), meta.block_table, meta.seq_lens, meta.block_size, scale)
        return out[..., :latent]
    bs = meta.block_size
    rows = cache.view(-1, bs, cache.shape[-1])[meta.block_table].flatten(1, 2).to(q.dtype)  # [Bd, NB*bs, L+R]
    mask = torch.arange(rows.shape[1])[None, :] < meta.seq_lens[:, None]                    # [Bd, NB*bs]
    scores = torch.einsum("bhd,bkd->bhk", q, rows) * scale
    scores.masked_fill_(~mask[:, None, :], float("-inf"))
    return torch.einsum("bhk,bkl->bhl", scores.softmax(-1), rows[..., :latent])


def decompressed_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float
                         ) -> torch.Tensor:
    """q [n, H, Dqk], k [context + n, H, Dqk], v [context + n, H, Dv] -> [n, H, Dv], causal."""
    n, total = q.shape[0], k.shape[0]
    mask = torch.arange(total)[None, :] <= (context + torch.arange(n))[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=scale)
    return out.transpose(0, 1)
