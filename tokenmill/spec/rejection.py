"""Verification of draft tokens by rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

A request with k drafts d_1..d_k gets k+1 rows of target logits: row j is the distribution of the
token after d_1..d_j. Every row goes through exactly the processing a plain step applies —
penalties and the min_tokens mask computed with d_1..d_j counted as output, then temperature,
top-k, top-p, min-p — giving p_j. Our proposers are deterministic, so the draft distribution q_j
is one-hot on d_j and the rule is: accept d_j with probability p_j(d_j); at the first rejection,
emit a sample from the residual max(0, p_j - q_j), i.e. p_j without d_j, renormalized, and stop;
if all k are accepted, emit a sample from p_k. Each emitted token is then distributed exactly as
p_j: P(d_j) = p_j(d_j), P(x ≠ d_j) = (1 - p_j(d_j)) p_j(x) / (1 - p_j(d_j)). Greedy rows are the
case p_j one-hot on argmax: drafts are accepted while they equal the argmax, so the output is
token-identical to decoding without drafts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenmill.core.outputs import SampledLogprobs
from tokenmill.sampling_params import SamplingParams
from tokenmill.worker.sampler import Sampler, SamplingRequest, gather_logprobs


@dataclass
class _Row:
    """One verification row of a request: its history includes the drafts before the row."""
    request_id: str
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_id: int | None

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


@dataclass
class Verified:
    token_ids: list[list[int]] = field(default_factory=list)  # per request: accepted drafts + one token
    logprobs: list[list[SampledLogprobs] | None] = field(default_factory=list)


def verify(sampler: Sampler, logits: torch.Tensor, reqs: list[SamplingRequest],
           drafts: list[list[int]]) -> Verified:
    """logits [sum(k_i + 1), vocab]: the rows of each request in order."""
    rows = [_Row(r.request_id, r.params, r.prompt_token_ids, r.output_token_ids + d[:j], r.eos_token_id)
            for r, d in zip(reqs, drafts) for j in range(len(d) + 1)]
    logits = logits[:, : sampler.vocab_size]
    raw = torch.log_softmax(logits, dim=-1) if any(r.params.logprobs is not None for r in reqs) else None
    processed = sampler.process(logits, rows)
    argmax = processed.argmax(dim=-1).tolist()
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    probs = {}
    if random_rows:
        p = sampler.probs(processed[torch.tensor(random_rows)], [rows[i] for i in random_rows])
        probs = dict(zip(random_rows, p))
    out = Verified()
    start = 0
    for req, d in zip(reqs, drafts):
        emitted, emitted_rows = _verify_one(sampler, req, d, start, argmax, probs)
        out.token_ids.append(emitted)
        if raw is not None and req.params.logprobs is not None:
            idx = torch.tensor(emitted_rows)
            out.logprobs.append(gather_logprobs(raw[idx], emitted, [rows[i] for i in emitted_rows]))
        else:
            out.logprobs.append(None)
        start += len(d) + 1
    return out


def _verify_one(sampler: Sampler, req: SamplingRequest, drafts: list[int], start: int, argmax: list[int],
                probs: dict[int, torch.Tensor]) -> tuple[list[int], list[int]]:
    emitted: list[int] = []
    for j, token in enumerate(drafts):
        row = start + j
        if req.params.greedy:
            if argmax[row] != token:
                return emitted + [argmax[row]], list(range(start, row + 1))
        elif sampler.uniform(req) >= probs[row][token].item():
            residual = probs[row].clone()
            residual[token] = 0.0
            return emitted + [_draw(sampler, req, residual)], list(range(start, row + 1))
        emitted.append(token)
    last = start + len(drafts)
    bonus = argmax[last] if req.params.greedy else _draw(sampler, req, probs[last])
    return emitted + [bonus], list(range(start, last + 1))


def _draw(sampler: Sampler, req: SamplingRequest, p: torch.Tensor) -> int:
    return int(sampler.race(p[None], [req])[0])
