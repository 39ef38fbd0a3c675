"""Attention backend interface: build metadata from the flat batch once per step, then
forward(q, k, v, kv_cache, metadata) per layer."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch



@dataclass
class BatchLayout:
    """The flat batch as the runner built it (all int64 CPU tensors unless noted).
    T tokens over B sequences; sequence b owns tokens query_start_loc[b]:query_start_loc[b+1]."""
    slot_mapping: torch.Tensor     # [T] where each new token's K/V is written
    query_start_loc: list[int]     # [B+1]
    seq_lens: list[int]            # [B] context length after this step (cached + new)
    block_tables: list[list[int]]  # [B][blocks]
    block_size: int
    # [B] prompt length of each sequence (a chunk with seq_lens[b] <= prompt_lens[b] is all prompt);
    # None: unknown, every row counts as a generated token's
    prompt_lens: list[int] | None = None

    @property
    def layout(self) -> BatchLayout:
        """The reference backend's metadata is the layout itself."""
        return self


@dataclass
class StepInputs:
    """What the C++ layer stack (kernels/csrc/layer_stack.cpp) needs of a step's attention."""
    slot_mapping: torch.Tensor  # [T] int64
    decode_rows: torch.Tensor   # [Bd] int64 flat row of each decode (unused when there are no chunks)
    block_tables: torch.Tensor  # [Bd, blocks] int64
    seq_lens: torch.Tensor      # [Bd] int64
    chunk_ints: list[int]       # 4 per prompt chunk: first row, end row, tokens cached before it, bf16 math
    chunk_blocks: list[torch.Tensor]  # [blocks] int64 per chunk
    block_size: int


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def build_metadata(self, layout: BatchLayout) -> object: ...

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: tuple[torch.Tensor, ...], meta: object, scale: float,
                sliding_window: int | None = None) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] for the new tokens. Writes k/v into kv_cache at the
        layout's slots, then attends each token to its sequence's cached context (causal; with
        `sliding_window` W, the query at position i sees keys j with i - j < W only, as Mistral).
        Every backend's metadata carries the step's `layout` (MLA attention reads it).
        kv_cache is (k, v) or, quantized, (k_q, v_q, k_scale, v_scale): use write_kv and
        gather_blocks / gather_slots from tokenmill.attention.kv_cache, which handle both.
        Returns [T, H, D]."""

    def step_inputs(self, meta: object, kv_caches: list, windows: set[int]) -> StepInputs | None:
        """For a step whose attention the C++ layer stack computes exactly as `forward` would (plain (k, v)
        caches that our store_kv, paged_decode and prefill_attention kernels read and write; `windows`:
        the layers' sliding windows, 0 for none), its inputs; None (the default): run `forward` layer by
        layer."""
        return None


def window_start(position: int, sliding_window: int | None) -> int:
    """The first key a query at `position` sees."""
    return 0 if not sliding_window else max(0, position - sliding_window + 1)


def context_slots(block_table: list[int], seq_len: int, block_size: int) -> torch.Tensor:
    blocks = torch.tensor(block_table[: -(-seq_len // block_size)], dtype=torch.long)
    slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    return slots[:seq_len]
