"""A separate draft model (same tokenizer as the target), in its own weight format (a .gguf draft
keeps its quantized blocks: a quantized copy of the target is a cheap draft with high acceptance),
drafts greedily with its own paged KV cache: its own per-layer tensors, sized for its layers and
heads, addressed by the target's block ids (same block size and count). It runs every flat batch
the target runs, at the same slots, so its cache holds exactly the positions the target's does:
prefix-cache hits, preemption and rollback need nothing more. Its drafting steps then write the
draft positions, as the target's verification pass does after them.

Except while nobody drafts (the batch is above disable_by_batch_size): mirroring a step then costs
the draft's share of every step for nothing, so it is skipped, and each block keeps a flag saying
whether the draft's KV in it is whole (set when the draft writes a block's first slot, cleared
when the target writes any slot the draft skipped). A request drafts only while every block
before its last token is whole; one that lived through a big batch (or adopts a cached block
computed then) stays undrafted."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from tokenmill.engine.resolve import read_arch, resolve_source
from tokenmill.models.loader import build_model
from tokenmill.models.model_config import ModelConfig, read_hf_config
from tokenmill.models.registry import get_model_class
from tokenmill.quant import quant_config
from tokenmill.spec.greedy_draft import GreedyDrafter
from tokenmill.spec.proposer import DraftRequest, Target


class DraftModelProposer(GreedyDrafter):
    def __init__(self, target: Target, k_max: int, model: str, quantization: str = "none") -> None:
        super().__init__(target, k_max)
        folder, gguf_file = resolve_source(model)
        arch = read_arch(folder)
        quant = quant_config(quantization, target.dtype, gguf_file,
                             hf_quant_config=read_hf_config(folder).get("quantization_config"))
        self.model = build_model(arch, folder, target.dtype, target.max_model_len, quant)
        self.kv_caches = get_model_class(arch.architecture).allocate_kv_caches(
            arch, target.kv_cache_dtype, target.dtype, target.block_size, target.num_blocks)
        self.whole = np.zeros(target.num_blocks, dtype=bool)  # per block: the draft's KV covers every written slot

    def observe(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object, drafting: bool = True) -> None:
        super().observe(input_ids, positions, meta, drafting)
        slots = meta.slot_mapping.numpy()
        slots = slots[slots >= 0]
        blocks = slots // self.target.block_size
        if not drafting:
            self.whole[blocks] = False
            return
        self.whole[blocks[slots % self.target.block_size == 0]] = True
        self.model(input_ids, positions, self.kv_caches, self.target.backend, meta)

    def propose(self, reqs: list[DraftRequest]) -> list[list[int]]:
        bs = self.target.block_size
        return super().propose([r if self.whole[r.block_ids[:-(-(len(r.token_ids) - 1) // bs)]].all()
                                else replace(r, k=0) for r in reqs])

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches, self.target.backend, meta))


def check_same_tokenizer(target: ModelConfig, target_tokenizer: str, draft: ModelConfig, draft_folder: str) -> None:
    """The draft's token ids must mean the target's: same vocabulary size and same tokenizer."""
    from tokenmill.engine.tokenizer import load_tokenizer
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"speculative_config.model: the draft's vocab_size {draft.vocab_size} differs from the "
                         f"target's {target.vocab_size}; the draft must use the target's tokenizer")
    a, b = load_tokenizer(target_tokenizer), load_tokenizer(draft_folder)
    if a.get_vocab() != b.get_vocab() or a.eos_token_id != b.eos_token_id:
        raise ValueError(f"speculative_config.model: the draft's tokenizer ({draft_folder}) differs from the "
                         f"target's ({target_tokenizer}); the draft must use the target's tokenizer")
