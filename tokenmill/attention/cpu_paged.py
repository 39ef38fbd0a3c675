"""CPU paged attention: decodes through our C++ kernel, which reads K/V in place from the paged cache
(tokenmill/kernels/csrc/paged_decode.cpp); prefill chunks one sequence at a time, through our causal
kernel (csrc/prefill_attention.cpp: float32 math, or bf16 products over a bf16 cache on AVX512_BF16
CPUs), else through SDPA.

Why: the torch backend copies every decode's whole context into a padded [B, L, Hkv, D] tensor per
layer before SDPA reads it again; at batch 64 x 272 tokens that copy was a third of the step
(docs/BENCHMARKS.md). The kernel reads each K/V row once and writes nothing but the output.
Prefill chunks are not padded to the longest chunk of the step. Our prefill kernel never multiplies
past the diagonal block; on the SDPA path (other dtypes) a long chunk is split into query pieces
that each attend only up to their own last position, so the masked upper triangle is mostly
skipped (CPU SDPA computes a masked score before discarding it)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

from tokenmill.attention.backend import AttentionBackend, BatchLayout, StepInputs
from tokenmill.attention.kv_cache import gather_blocks, is_quantized, write_kv
from tokenmill.kernels import cpu_ops

# Query pieces for chunks longer than this (the best sizes measured; docs/BENCHMARKS_HISTORY.md)
PIECE = 128
SPLIT_ABOVE = 256
# A chunk of at most this many generated tokens (speculative verification's k+1 rows) runs as that
# many decode rows, each seeing the keys up to its own position: paged_decode reads the blocks in
# place, where the chunk path gathers the whole context each layer (1.5x at 1,000 tokens of context,
# 10x at 7,900; docs/BENCHMARKS.md, session 37). In batch-invariant mode prompt chunks this short do
# too, so every row is computed as a plain decode step would compute it
DECODE_ROWS_MAX = 16


@dataclass
class _Decodes:
    rows: torch.Tensor | None   # [Bd] flat token index of each decode; None when every token is one
    block_table: torch.Tensor   # [Bd, NB] int64
    seq_lens: torch.Tensor      # [Bd] int64


@dataclass
class _Piece:
    q_start: int                # within the chunk
    q_end: int
    k_end: int                  # keys [0, k_end) of the sequence
    mask: torch.Tensor | None   # [q_end - q_start, k_end] True where allowed; None: all allowed


@dataclass
class _Prefill:
    start: int                  # flat token rows [start, end) of this chunk
    end: int
    context: int                # tokens cached before this chunk
    block_table: torch.Tensor   # [1, NB] int64
    prompt: bool = False        # every row is a prompt token's (not a draft being verified)

    @cached_property
    def pieces(self) -> list[_Piece]:
        """Query pieces for the SDPA path (built only when it runs: float32 uses our kernel)."""
        return self.window_pieces(None)

    def window_pieces(self, sliding_window: int | None) -> list[_Piece]:
        n = self.end - self.start
        step = PIECE if n > SPLIT_ABOVE else n
        pieces = []
        for qs in range(0, n, step):
            qe = min(n, qs + step)
            k_end = self.context + qe
            # query i (absolute position context + qs + i) sees keys 0..context + qs + i
            pos = (self.context + qs + torch.arange(qe - qs))[:, None]
            keys = torch.arange(k_end)[None, :]
            mask = keys <= pos
            if sliding_window:  # ... and only the last sliding_window of them
                mask &= keys > pos - sliding_window
            pieces.append(_Piece(qs, qe, k_end, mask))
        return pieces

    def window_binds(self, sliding_window: int | None) -> bool:
        """Some query of this chunk has more keys than the window."""
        return bool(sliding_window) and self.context + (self.end - self.start) > sliding_window


@dataclass
class CpuPagedMetadata:
    slot_mapping: torch.Tensor
    block_size: int
    decodes: _Decodes | None
    prefills: list[_Prefill]
    layout: BatchLayout


class CpuPagedBackend(AttentionBackend):
    name = "cpu"

    def __init__(self) -> None:
        if not cpu_ops.load():
            raise RuntimeError("attention_backend='cpu' needs the C++ kernels, which could not be built here "
                               "(see the warning above); use attention_backend='torch'")

    def build_metadata(self, layout: BatchLayout) -> CpuPagedMetadata:
        qsl = layout.query_start_loc
        q_lens = [qsl[b + 1] - qsl[b] for b in range(len(layout.seq_lens))]
        invariant = cpu_ops.batch_invariant()
        # without prompt lengths a short chunk may be a prompt's: only lone rows are decodes then
        rows_max = DECODE_ROWS_MAX if invariant or layout.prompt_lens is not None else 1
        # Outside batch-invariant mode every prompt row takes the prefill kernel, a lone one too
        # (a prompt's last token after a prefix hit, or a chunk of one): prompt rows then get the
        # same math (bf16 over a bf16 cache) whatever the caching and chunking
        as_decode = [n <= rows_max and (invariant or _prompt_rows(layout, b) == 0) for b, n in enumerate(q_lens)]
        decode = [b for b in range(len(q_lens)) if as_decode[b]]
        prefills = [piece for b in range(len(q_lens)) if not as_decode[b] for piece in _build_prefill(layout, b)]
        decodes = _build_decodes(layout, decode, q_lens) if decode else None
        return CpuPagedMetadata(layout.slot_mapping, layout.block_size, decodes, prefills, layout)

    def forward(self, q, k, v, kv_cache, meta: CpuPagedMetadata, scale: float, sliding_window: int | None = None
                ) -> torch.Tensor:
        if not is_quantized(kv_cache) and _storable(kv_cache[0].dtype, k.dtype) and k.stride(-1) == 1 \
                and v.stride(-1) == 1:
            # a row copy; float32 rows into a bf16 cache are rounded in place, so k, v == the cache
            torch.ops.tokenmill.store_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)
            stored = True
        else:
            stored = False
            write_kv(kv_cache, k, v, meta.slot_mapping)
        d = meta.decodes
        if not meta.prefills and d is not None and d.rows is None:  # a pure decode step: no copies at all
            return cpu_ops.paged_decode(q, kv_cache, d.block_table, d.seq_lens, meta.block_size, scale,
                                        sliding_window)
        out = q.new_empty(q.shape)
        if d is not None:
            out[d.rows] = cpu_ops.paged_decode(q[d.rows], kv_cache, d.block_table, d.seq_lens, meta.block_size,
                                               scale, sliding_window)
        for p in meta.prefills:
            _prefill(q, k, v, kv_cache, p, meta.block_size, scale, out, fresh_equals_cache=stored,
                     sliding_window=sliding_window)
        return out

    def step_inputs(self, meta: CpuPagedMetadata, kv_caches: list, windows: set[int]) -> StepInputs | None:
        """The step as `forward` runs it over float32 activations: store_kv, decodes through paged_decode,
        chunks through our prefill kernel (over this step's k/v when nothing is cached before them).
        None for a quantized cache, or a chunk some layer's window binds (SDPA computes those)."""
        if not kv_caches or any(len(c) != 2 or c[0].dtype != kv_caches[0][0].dtype for c in kv_caches):
            return None  # quantized: 4 tensors
        dtype = kv_caches[0][0].dtype
        if dtype not in (torch.float32, torch.bfloat16) or any(p.window_binds(w) for p in meta.prefills for w in windows):
            return None
        d = meta.decodes
        bf16_prompts = dtype == torch.bfloat16 and not cpu_ops.batch_invariant()
        chunk_ints = [n for p in meta.prefills for n in (p.start, p.end, p.context, int(p.prompt and bf16_prompts))]
        if d is None:
            rows, tables, lens = _NO_ROWS, _NO_TABLES, _NO_ROWS
        else:
            rows = d.rows if d.rows is not None else _NO_ROWS
            tables, lens = d.block_table, d.seq_lens
        return StepInputs(meta.slot_mapping, rows, tables, lens, chunk_ints, [p.block_table[0] for p in meta.prefills],
                          meta.block_size)


_NO_ROWS = torch.empty(0, dtype=torch.long)
_NO_TABLES = torch.empty(0, 1, dtype=torch.long)


def _storable(cache_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """store_kv copies rows of the cache's dtype, or rounds float32 rows into a bf16 cache."""
    return cache_dtype == dtype or (cache_dtype == torch.bfloat16 and dtype == torch.float32)


def _prefill(q, k, v, kv_cache, p: _Prefill, block_size: int, scale: float, out: torch.Tensor,
             fresh_equals_cache: bool, sliding_window: int | None = None) -> None:
    """A chunk whose window binds (some query has more keys than the window) takes the SDPA path
    with a window mask: our causal kernel has no window."""
    windowed = p.window_binds(sliding_window)
    ours = q.dtype == torch.float32 and not windowed  # our causal kernel: [Q, H, D] x [L, Hkv, D], strided views welcome
    # Prompt rows over a plain bf16 cache: the kernel reads its K/V as they are and, on AVX512_BF16
    # CPUs, rounds q and the softmax numerators to bf16 too (vdpbf16ps; docs/BENCHMARKS.md, "Prefill
    # attention in bf16"). Generated rows (decodes, drafts being verified) keep float32 math, so
    # speculation does not change greedy outputs; batch-invariant mode keeps it everywhere.
    bf16 = ours and p.prompt and kv_cache[0].dtype == torch.bfloat16 and not is_quantized(kv_cache) \
        and not cpu_ops.batch_invariant()
    if p.context == 0 and fresh_equals_cache:
        # a fresh prompt in a plain cache: its keys are exactly this step's k/v, no gather needed
        kb, vb = k[p.start:p.end], v[p.start:p.end]
    else:  # cached context (or quantized storage): read what the cache holds
        length = p.context + (p.end - p.start)
        dtype = torch.bfloat16 if bf16 else q.dtype
        kb, vb = (x[0, :length] for x in gather_blocks(kv_cache, p.block_table, block_size, dtype))
    if ours:
        out[p.start:p.end] = torch.ops.tokenmill.prefill_attention(q[p.start:p.end], kb, vb, p.context, scale, bf16)
        return
    qb = q[p.start:p.end].transpose(0, 1).unsqueeze(0)                       # [1, H, Q, D]
    kb, vb = kb.transpose(0, 1).unsqueeze(0), vb.transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
    for piece in (p.window_pieces(sliding_window) if windowed else p.pieces):
        o = F.scaled_dot_product_attention(qb[:, :, piece.q_start:piece.q_end], kb[:, :, :piece.k_end],
                                           vb[:, :, :piece.k_end], attn_mask=piece.mask, scale=scale,
                                           enable_gqa=True)
        out[p.start + piece.q_start:p.start + piece.q_end] = o[0].transpose(0, 1)


def _prompt_rows(layout: BatchLayout, b: int) -> int:
    """How many of sequence b's rows this step are prompt tokens (0 without prompt lengths)."""
    if layout.prompt_lens is None:
        return 0
    n = layout.query_start_loc[b + 1] - layout.query_start_loc[b]
    return min(max(layout.prompt_lens[b] - (layout.seq_lens[b] - n), 0), n)


def _build_prefill(layout: BatchLayout, b: int) -> list[_Prefill]:
    """Sequence b's chunk; one that runs past its prompt (a preempted request recomputing its
    generated tokens) is split there, so its prompt rows get the prompt rows' math."""
    start, end = layout.query_start_loc[b], layout.query_start_loc[b + 1]
    table = torch.tensor([layout.block_tables[b]], dtype=torch.long)
    context = layout.seq_lens[b] - (end - start)
    split = _prompt_rows(layout, b)
    if split in (0, end - start):
        return [_Prefill(start, end, context, table, prompt=split > 0)]
    return [_Prefill(start, start + split, context, table, prompt=True),
            _Prefill(start + split, end, context + split, table, prompt=False)]


def _build_decodes(layout: BatchLayout, seqs: list[int], q_lens: list[int]) -> _Decodes:
    """One decode row per token of the given sequences: token i of a chunk of n sees the sequence's
    keys up to its own position (seq_len - n + i + 1)."""
    max_blocks = max(len(layout.block_tables[b]) for b in seqs)
    tables = torch.zeros(sum(q_lens[b] for b in seqs), max_blocks, dtype=torch.long)
    rows, seq_lens = [], []
    for b in seqs:
        block_row = torch.tensor(layout.block_tables[b], dtype=torch.long)
        start, n = layout.query_start_loc[b], q_lens[b]
        for i in range(n):
            tables[len(rows), :len(block_row)] = block_row
            rows.append(start + i)
            seq_lens.append(layout.seq_lens[b] - n + i + 1)
    every_token = rows == list(range(layout.query_start_loc[-1]))
    return _Decodes(None if every_token else torch.tensor(rows), tables, torch.tensor(seq_lens, dtype=torch.long))
