"""The base of the proposers that run a model (layer_skip, draft_model): k greedy steps over one
flat batch holding one token per request. Step j feeds each request's token at position P+j (P:
its last token's) and writes that token's KV in the draft's layers at the request's own slot; the
argmax is its next draft. How many steps run is `DraftLength`'s call, from measured costs and
acceptance."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from tokenmill.attention import BatchLayout
from tokenmill.spec.draft_length import DraftLength
from tokenmill.spec.proposer import DraftRequest, Target


class GreedyDrafter:
    def __init__(self, target: Target, k_max: int) -> None:
        self.target = target
        self.length = DraftLength(k_max)
        self._step_start: float | None = None
        self._draft_s = 0.0  # spent drafting since _step_start
        self._draft_step_s: float | None = None

    def logits(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object) -> torch.Tensor:
        """The draft's logits [n, vocab] for a flat batch (writing the draft layers' KV)."""
        raise NotImplementedError

    def observe(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: object, drafting: bool = True) -> None:
        now = time.perf_counter()
        if self._step_start is not None:
            self.length.observe_times(now - self._step_start - self._draft_s, self._draft_step_s)
        self._step_start, self._draft_s, self._draft_step_s = now, 0.0, None

    def propose(self, reqs: list[DraftRequest]) -> list[list[int]]:
        for r in reqs:
            if r.num_drafted:
                self.length.observe_verification(r.num_drafted, r.num_accepted)
        k = self.length.best_k()
        t0 = time.perf_counter()
        drafts = self._draft([replace(r, k=min(r.k, k)) for r in reqs])
        steps = max(map(len, drafts), default=0)
        if steps:
            elapsed = time.perf_counter() - t0
            self._draft_s += elapsed
            self._draft_step_s = elapsed / steps
        return drafts

    def _draft(self, reqs: list[DraftRequest]) -> list[list[int]]:
        bs, backend = self.target.block_size, self.target.backend
        vocab = self.target.model.config.vocab_size
        ks = [_room(r, bs, self.target.max_model_len) for r in reqs]
        drafts: list[list[int]] = [[] for _ in reqs]
        for j in range(max(ks, default=0)):
            active = [i for i, k in enumerate(ks) if k > j]
            ids = [reqs[i].token_ids[-1] if j == 0 else drafts[i][-1] for i in active]
            pos = np.array([len(reqs[i].token_ids) - 1 + j for i in active])
            tables = [reqs[i].block_ids for i in active]
            slots = np.array([t[p // bs] * bs + p % bs for t, p in zip(tables, pos)])
            layout = BatchLayout(torch.from_numpy(slots), list(range(len(active) + 1)), (pos + 1).tolist(), tables, bs)
            logits = self.logits(torch.tensor(ids), torch.from_numpy(pos), backend.build_metadata(layout))
            for i, token in zip(active, logits[:, :vocab].argmax(dim=-1).tolist()):
                drafts[i].append(token)
        return drafts


def _room(req: DraftRequest, block_size: int, max_model_len: int) -> int:
    """Drafts that fit: fed positions P..P+k-1 inside the request's slots, drafted ones inside the
    context."""
    p = len(req.token_ids) - 1
    return max(0, min(req.k, len(req.block_ids) * block_size - p, max_model_len - 1 - p))
