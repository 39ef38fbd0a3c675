"""MoE routers: which experts each token goes to, with which weight, exactly as each reference
model defines it (transformers' Mixtral, Qwen2-MoE, DeepSeek-V2 and -V3 routers).

route(logits [T, E] float32, spec, correction_bias) -> (weights [T, k] float32, ids [T, k] int64).
"""
from __future__ import annotations

import torch

from tokenmill.models.model_config import MoESpec


def route(logits: torch.Tensor, spec: MoESpec, correction_bias: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    if spec.scoring == "softmax":
        scores = logits.softmax(dim=-1)
        choice = scores
    else:  # sigmoid (DeepSeek-V3): the bias steers the choice, never the weights
        scores = logits.sigmoid()
        choice = scores + correction_bias if correction_bias is not None else scores
    if spec.num_groups:
        choice = _mask_groups(choice, spec)
    ids = torch.topk(choice, spec.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if spec.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if spec.scoring == "sigmoid" else 0.0))
    if spec.routed_scaling_factor != 1.0:
        weights = weights * spec.routed_scaling_factor
    return weights, ids


def _mask_groups(choice: torch.Tensor, spec: MoESpec) -> torch.Tensor:
    """Keep only the experts of each token's topk_group best groups (the others can't be chosen).
    V2 zeroes them (softmax scores are > 0, so a masked expert loses to any kept one); V3 sets -inf."""
    grouped = choice.view(choice.shape[0], spec.num_groups, -1)
    if spec.group_score == "top2_sum":
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    else:
        group_scores = grouped.max(dim=-1).values
    best = torch.topk(group_scores, spec.topk_group, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    fill = 0.0 if spec.scoring == "softmax" else float("-inf")
    return grouped.masked_fill(~keep[:, :, None], fill).view_as(choice)
