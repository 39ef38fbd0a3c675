"""The proposer interface the model runner calls, and the factory that builds one per method.

After each step the runner asks the proposer for the drafts of every request that sampled; the
scheduler budgets them (k+1 positions) next step, `spec/rejection.py` verifies them, and the core
rolls back the slots of rejected ones. A proposer that runs a model writes KV at the draft
positions P..P+k-1 (P: the position of the token sampled this step, whose KV is not written
yet); the scheduler reserves those slots ahead (`num_lookahead_tokens`), and the verification
pass rewrites them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tokenmill.attention.backend import AttentionBackend
from tokenmill.config import SpeculativeConfig
from tokenmill.models.base import CausalLM


@dataclass
class DraftRequest:
    token_ids: list[int]  # prompt + output; the last one was sampled this step and has no KV yet
    block_ids: list[int]  # the request's blocks, lookahead ones included
    k: int  # drafts wanted
    num_drafted: int = 0  # drafts it verified this step
    num_accepted: int = 0  # of which accepted


class Proposer(Protocol):
    def observe(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object, drafting: bool = True) -> None:
        """The target just ran this flat batch (a draft model mirrors it to keep its own KV).
        drafting=False: nobody drafts after this step (the batch is above disable_by_batch_size),
        so a draft model may skip mirroring it."""

    def propose(self, reqs: list[DraftRequest]) -> list[list[int]]:
        """Up to k draft tokens per request, to follow its last token."""


@dataclass
class Target:
    """What a proposer may share with the target: its model, KV tensors and layout."""
    model: CausalLM
    kv_caches: list
    backend: AttentionBackend
    block_size: int
    num_blocks: int
    kv_cache_dtype: str
    dtype: torch.dtype
    max_model_len: int


def make_proposer(spec: SpeculativeConfig, target: Target) -> Proposer:
    if spec.method == "ngram":
        from tokenmill.spec.ngram import NgramProposer
        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "layer_skip":
        from tokenmill.spec.layer_skip import LayerSkipProposer
        return LayerSkipProposer(target, spec.num_speculative_tokens, spec.num_draft_layers)
    if spec.method == "draft_model":
        from tokenmill.spec.draft_model import DraftModelProposer
        return DraftModelProposer(target, spec.num_speculative_tokens, spec.model, spec.quantization or "none")
    raise ValueError(f"speculative_config.method {spec.method!r} has no proposer")
