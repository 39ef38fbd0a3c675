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
class DecodeInputs:
    """What the C++ decode stack (kernels/csrc/decode_stack.cpp) needs of a pure decode step."""
    slot_mapping: torch.Tensor  # [B] int64
    block_tables: torch.Tensor  # [B, blocks] int64
    seq_lens: torch.Tensor      # [B] int64
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

    def decode_inputs(self, meta: object, kv_caches: list) -> DecodeInputs | None:
        """For a step whose every row is one decode, over plain (k, v) caches that our paged_decode and
        store_kv kernels read and write exactly as `forward` would: the inputs of the C++ decode
        stack; None (the default): run `forward` layer by layer."""
        return None


def window_start(position: int, sliding_window: int | None) -> int:
    """The first key a query at `position` sees."""
    return 0 if not sliding_window else max(0, position - sliding_window + 1)


def context_slots(block_table: list[int], seq_len: int, block_size: int) -> torch.Tensor:
    blocks = torch.tensor(block_table[: -(-seq_len // block_size)], dtype=torch.long)
    slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    return slots[:seq_len]
