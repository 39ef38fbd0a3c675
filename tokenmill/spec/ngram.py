"""Prompt lookup (n-gram) proposer: no second model. The draft is what followed the latest earlier
occurrence of the request's last n tokens in its own prompt and output, trying n from
prompt_lookup_max down to prompt_lookup_min. Strong where the output repeats its input
(summaries, extraction, code edits, retrieval-augmented answers); proposes nothing otherwise."""
from __future__ import annotations

import numpy as np
import torch

from tokenmill.spec.proposer import DraftRequest


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def observe(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object, drafting: bool = True) -> None:
        pass  # no model

    def propose(self, reqs: list[DraftRequest]) -> list[list[int]]:
        return [self.lookup(r.token_ids, r.k) for r in reqs]

    def lookup(self, token_ids: list[int], k: int | None = None) -> list[int]:
        k = self.k if k is None else k
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            start = _latest_match(ids, n)
            if start is not None:
                return _continue_from(token_ids, start + n, k)
        return []


def _continue_from(token_ids: list[int], pos: int, k: int) -> list[int]:
    """k tokens copied from `pos` on; where the copy reaches the end it goes on from its own start,
    as in LZ77, so a repeating pattern whose latest match overlaps the end (a period shorter than
    k) still yields k tokens."""
    out: list[int] = []
    n = len(token_ids)
    for i in range(k):
        src = pos + i
        out.append(token_ids[src] if src < n else out[src - n])
    return out


def _latest_match(ids: np.ndarray, n: int) -> int | None:
    """Start of the latest occurrence of the last n tokens that ends before them."""
    pattern = ids[-n:]
    # candidate starts: positions 0 .. len-n-1 whose first token matches, newest first
    candidates = np.flatnonzero(ids[: len(ids) - n] == pattern[0])[::-1]
    for start in candidates:
        if np.array_equal(ids[start:start + n], pattern):
            return int(start)
    return None
