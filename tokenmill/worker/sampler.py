"""Vectorised sampling over the batch: penalties, temperature, top-k, top-p, min-p, seeds, logprobs.

Random rows draw by inverting their CDF at one uniform each (`draw_by_cdf`); seeded rows use the
exponential-race trick (argmax of p / Exp(1) noise is a sample from p), so a seeded request only needs
its own noise row: its samples do not depend on who else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.bitmask import GrammarBitmask

from tokenmill.core.outputs import SampledLogprobs


class SamplingRequest(Protocol):
    """What the sampler reads of a request (the runner's RunnerRequest)."""
    request_id: str
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_id: int | None

    @property
    def num_output_tokens(self) -> int: ...


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[SampledLogprobs | None]  # per row, None where the request asked for none


class Sampler:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.generators: dict[str, torch.Generator] = {}
        self.allowed: dict[str, torch.Tensor] = {}  # allowed_token_ids as a tensor, built once per request

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)
        self.allowed.pop(request_id, None)

    def generator(self, req: SamplingRequest) -> torch.Generator:
        gen = self.generators.get(req.request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(req.params.seed)
            self.generators[req.request_id] = gen
        return gen

    def __call__(self, logits: torch.Tensor, reqs: list[SamplingRequest],
                 grammar: GrammarBitmask | None = None) -> SamplerOutput:
        """`grammar`: the allowed tokens of the constrained rows (structured outputs)."""
        logits = logits[:, : self.vocab_size]
        want_logprobs = [r.params.logprobs is not None for r in reqs]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        logits = self.process(logits, reqs)
        if grammar is not None:
            grammar.apply(logits)  # in place: the runner passes rows gathered for this call
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if random_rows:
            idx = torch.tensor(random_rows)
            sampled = self._sample(logits[idx], [reqs[i] for i in random_rows])
            tokens[idx] = sampled
        token_list = tokens.tolist()
        return SamplerOutput(token_list, gather_logprobs(raw_logprobs, token_list, reqs))

    def _sample(self, logits: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
        probs = self.probs(logits, reqs)
        seeded = [i for i, r in enumerate(reqs) if r.params.seed is not None]
        if not seeded:
            return draw_by_cdf(probs)
        # seeded rows keep the race: their draws come from their own generators (and replay across engines)
        tokens = draw_by_cdf(probs)
        idx = torch.tensor(seeded)
        tokens[idx] = self.race(probs[idx], [reqs[i] for i in seeded])
        return tokens

    def race(self, probs: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
        """One token per row drawn from probs (argmax of p / Exp(1) noise); a seeded request draws
        its noise from its own generator."""
        noise = torch.empty_like(probs).exponential_()
        for i, r in enumerate(reqs):
            if r.params.seed is not None:
                fresh = r.request_id not in self.generators
                gen = self.generator(r)
                if fresh:  # tokens another engine sampled (a prefill engine's first): replay their draws
                    for _ in range(r.num_output_tokens):
                        torch.empty_like(noise[i]).exponential_(generator=gen)
                noise[i].exponential_(generator=gen)
        return (probs / noise).argmax(dim=-1)

    def uniform(self, req: SamplingRequest) -> float:
        gen = self.generator(req) if req.params.seed is not None else None
        return torch.rand(1, generator=gen).item()

    @staticmethod
    def argmax_only(reqs: list[SamplingRequest]) -> bool:
        """Every row is greedy over the raw logits (no logprobs, penalties, logit shaping or
        min_tokens mask): its token is the logits' argmax, which the LM head can give without them."""
        return all(r.params.greedy and r.params.logprobs is None and not r.params.uses_penalties
                   and not r.params.shapes_logits and r.num_output_tokens >= r.params.min_tokens for r in reqs)

    def process(self, logits: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
        """Penalties and the min_tokens mask: what every row goes through before greedy or random
        choice (logits [rows, vocab], already cut to the vocabulary)."""
        if any(r.params.uses_penalties for r in reqs):
            logits = _apply_penalties(logits.clone(), reqs)
        if any(r.params.shapes_logits for r in reqs):
            logits = _bias_and_allow(logits.clone(), reqs, self.allowed)
        return _mask_until_min_tokens(logits, reqs)

    def probs(self, logits: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
        """The distribution a random row samples from: temperature, top-k, top-p, min-p; normalized."""
        temp = torch.tensor([r.params.temperature for r in reqs], dtype=logits.dtype)
        logits = logits / temp[:, None]
        top_k = [r.params.top_k for r in reqs]
        if any(k > 0 for k in top_k):
            k = torch.tensor([k if k > 0 else self.vocab_size for k in top_k]).clamp(max=logits.shape[-1])
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
            logits = logits.masked_fill(logits < kth, float("-inf"))
        top_p = [r.params.top_p for r in reqs]
        if any(p < 1.0 for p in top_p):
            logits = _top_p(logits, torch.tensor(top_p, dtype=logits.dtype))
        probs = logits.softmax(dim=-1)
        min_p = [r.params.min_p for r in reqs]
        if any(p > 0 for p in min_p):
            thresh = torch.tensor(min_p, dtype=probs.dtype)[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < thresh, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs


CDF_BLOCK = 1024  # vocabulary entries per block of draw_by_cdf's two-level search


def draw_by_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from probs [B, V] (rows summing to ~1) by inverting its CDF at one
    uniform per row: a block of CDF_BLOCK entries chosen by the float64 CDF of the block sums, then
    the entry inside it by its own float64 CDF (float64 over short rows: no float32 drift across
    49k entries). The exponential race draws V exponentials per row: 35 ms a step at 25 rows of a
    49,152-entry vocabulary on 2 cores, against ~1-2 ms here. A zero-probability entry is never
    drawn: the target lies in (0, total], and the first entry whose CDF reaches it adds mass."""
    B, V = probs.shape
    nb = -(-V // CDF_BLOCK)
    padded = torch.nn.functional.pad(probs, (0, nb * CDF_BLOCK - V)).view(B, nb, CDF_BLOCK)
    block_cdf = padded.sum(-1, dtype=torch.float64).cumsum(-1)  # [B, nb]
    target = (1.0 - torch.rand(B, 1, dtype=torch.float64)) * block_cdf[:, -1:]  # in (0, total]
    block = torch.searchsorted(block_cdf, target).clamp_(max=nb - 1)  # [B, 1]
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    inner = padded.gather(1, block[:, :, None].expand(B, 1, CDF_BLOCK))[:, 0].double().cumsum(-1)  # [B, BLOCK]
    within = torch.searchsorted(inner, target - before).clamp_(max=CDF_BLOCK - 1)
    tokens = (block * CDF_BLOCK + within).squeeze(1).clamp_(max=V - 1)
    # float64 rounding can leave the target a hair past a block's last entry: step back to an entry with mass
    bad = probs.gather(1, tokens[:, None])[:, 0] <= 0
    for i in bad.nonzero().flatten().tolist():
        mass = torch.nonzero(probs[i] > 0).flatten()
        if len(mass):
            earlier = mass[mass <= tokens[i]]
            tokens[i] = earlier[-1] if len(earlier) else mass[0]
    return tokens


def _top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - top_p[:, None])
    drop[:, -1] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _apply_penalties(logits: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
    batch, vocab = logits.shape
    counts = torch.zeros(batch, vocab, dtype=logits.dtype)
    seen_prompt = torch.zeros(batch, vocab, dtype=torch.bool)
    for i, r in enumerate(reqs):  # builds index tensors only; the math below is batched
        out = r.output_token_ids
        if out:
            counts[i].index_add_(0, torch.tensor(out), torch.ones(len(out), dtype=logits.dtype))
        if r.params.repetition_penalty != 1.0:
            seen_prompt[i, torch.tensor(r.prompt_token_ids)] = True
    rep = torch.tensor([r.params.repetition_penalty for r in reqs], dtype=logits.dtype)[:, None]
    freq = torch.tensor([r.params.frequency_penalty for r in reqs], dtype=logits.dtype)[:, None]
    pres = torch.tensor([r.params.presence_penalty for r in reqs], dtype=logits.dtype)[:, None]
    seen = seen_prompt | (counts > 0)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    return logits - freq * counts - pres * (counts > 0).to(logits.dtype)


def _bias_and_allow(logits: torch.Tensor, reqs: list[SamplingRequest],
                    allowed: dict[str, torch.Tensor]) -> torch.Tensor:
    """OpenAI's logit_bias (added to the logits), vLLM's allowed_token_ids (every other token
    masked) and bad_words (a word's last token masked where the output ends with the rest of it),
    per row; `logits` is the caller's copy."""
    for i, r in enumerate(reqs):
        p = r.params
        for word in p.bad_words_token_ids or ():
            *head, last = word
            if not head or r.output_token_ids[-len(head):] == head:
                logits[i, last] = float("-inf")
        if p.allowed_token_ids is not None:
            keep = allowed.get(r.request_id)
            if keep is None:
                keep = allowed[r.request_id] = torch.tensor(p.allowed_token_ids)
            row = torch.full_like(logits[i], float("-inf"))
            row[keep] = logits[i, keep]
            logits[i] = row
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias))
            logits[i, ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype)
    return logits


def _mask_until_min_tokens(logits: torch.Tensor, reqs: list[SamplingRequest]) -> torch.Tensor:
    rows = [(i, r) for i, r in enumerate(reqs) if r.num_output_tokens < r.params.min_tokens]
    if not rows:
        return logits
    logits = logits.clone()
    for i, r in rows:
        stop_ids = list(r.params.stop_token_ids) + ([r.eos_token_id] if r.eos_token_id is not None else [])
        if stop_ids:
            logits[i, torch.tensor(stop_ids)] = float("-inf")
    return logits


def gather_logprobs(raw: torch.Tensor | None, tokens: list[int], reqs: list[SamplingRequest]):
    if raw is None:
        return [None] * len(reqs)
    records = logprob_records(raw, tokens, max(r.params.logprobs or 0 for r in reqs))
    out: list[SampledLogprobs | None] = []
    for rec, r in zip(records, reqs):
        k = r.params.logprobs
        if k is not None and len(rec.top) != k:
            rec = SampledLogprobs(rec.logprob, rec.rank, rec.top[:k])
        out.append(None if k is None else rec)
    return out


def logprob_records(raw: torch.Tensor, tokens: list[int] | torch.Tensor, k: int) -> list[SampledLogprobs]:
    """Per row of raw logprobs [rows, vocab]: the token's logprob, its rank (as vLLM: 1 + the
    tokens strictly more likely) and the top-k alternatives."""
    top_vals, top_ids = raw.topk(k, dim=-1) if k else (None, None)
    chosen = raw.gather(1, torch.as_tensor(tokens)[:, None])
    ranks = ((raw > chosen).sum(dim=-1) + 1).tolist()
    chosen = chosen.squeeze(1).tolist()
    if not k:
        return [SampledLogprobs(c, r, []) for c, r in zip(chosen, ranks)]
    ids, vals = top_ids.tolist(), top_vals.tolist()
    return [SampledLogprobs(c, r, list(zip(i, v))) for c, r, i, v in zip(chosen, ranks, ids, vals)]


PROMPT_LOGPROBS_ROWS = 256  # logits rows at a time: 256 x a 150k vocabulary is 150 MB of float32


def prompt_logprobs(compute_logits, hidden: torch.Tensor, targets: torch.Tensor, k: int,
                    vocab_size: int) -> list[SampledLogprobs]:
    """Teacher-forced logprobs of the target tokens from the hidden states of the positions before
    them (the raw distribution, as sampled logprobs), a slice of rows at a time."""
    out: list[SampledLogprobs] = []
    for a in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
        logits = compute_logits(hidden[a:a + PROMPT_LOGPROBS_ROWS])[:, :vocab_size]
        out += logprob_records(torch.log_softmax(logits.float(), dim=-1), targets[a:a + PROMPT_LOGPROBS_ROWS], k)
    return out
