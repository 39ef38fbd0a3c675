"""Self-speculative drafting (early exit): the target's own first L layers, its final norm and LM
head draft greedily, so every model has a draft with nothing to load. The draft's layers ARE the
target's first L layers, so their KV at every computed position is already in the paged cache;
the draft only writes its own speculative positions P..P+k-1, which the verification pass
rewrites for all layers (and the core rolls back where rejected)."""
from __future__ import annotations

import torch

from tokenmill.spec.greedy_draft import GreedyDrafter
from tokenmill.spec.proposer import Target


def default_num_draft_layers(num_layers: int) -> int:
    # half; on SmolLM2-135M no early exit pays (docs/BENCHMARKS.md "Speculative decoding"), and
    # DraftLength then turns drafting off by itself
    return max(1, num_layers // 2)


class LayerSkipProposer(GreedyDrafter):
    def __init__(self, target: Target, k_max: int, num_layers: int) -> None:
        super().__init__(target, k_max)
        self.num_layers = num_layers

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        t = self.target
        hidden = t.model.forward_first_layers(input_ids, positions, t.kv_caches, t.backend, meta, self.num_layers)
        return t.model.compute_logits(hidden)
