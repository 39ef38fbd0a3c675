"""Perplexity through the public API: a text cut into windows of tokens, each window sent as a
prompt with `SamplingParams(prompt_logprobs=0)`, and the logprob of every token after a window's
first averaged. Any engine configuration (dtype, KV cache dtype, weight quantization) is measured
the way users run it: chunked prefill, the paged KV cache, the batch."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tokenmill.sampling_params import SamplingParams


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token, nats
    num_tokens: int  # tokens scored (every window's tokens but its first)
    num_windows: int
    window: int


def windows(token_ids: list[int], window: int) -> list[list[int]]:
    """Consecutive, non-overlapping windows of `window` tokens; the last may be shorter (one of a
    single token is dropped: it has nothing to score)."""
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    out = [token_ids[i:i + window] for i in range(0, len(token_ids), window)]
    return [w for w in out if len(w) >= 2]


def window_logprobs(llm, wins: list[list[int]]) -> list[list[float]]:
    """log p(w[i] | w[:i]) for i >= 1 of each window, from the engine's prompt logprobs."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": w} for w in wins], params, use_tqdm=False)
    result = []
    for w, out in zip(wins, outs):
        if out.error:
            raise ValueError(f"perplexity window of {len(w)} tokens: {out.error}")
        result.append([out.prompt_logprobs[i][w[i]].logprob for i in range(1, len(w))])
    return result


def perplexity(llm, text: str, window: int, num_tokens: int = 0) -> PerplexityResult:
    """`text` tokenized without special tokens (the first `num_tokens`, 0: all), in windows."""
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    ids = ids[:num_tokens] if num_tokens else ids
    wins = windows(ids, window)
    if not wins:
        raise ValueError("the text has fewer than 2 tokens: nothing to score")
    lps = [lp for win in window_logprobs(llm, wins) for lp in win]
    nll = -math.fsum(lps) / len(lps)
    return PerplexityResult(math.exp(nll), nll, len(lps), len(wins), window)
