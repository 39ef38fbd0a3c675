"""`echo` on /v1/completions (OpenAI's legacy semantics) and vLLM's `prompt_logprobs` field.

echo returns the prompt text before the completion; with `logprobs`, the prompt tokens' logprobs
come first in tokens / token_logprobs / top_logprobs / text_offset (the first token has no logprob:
null). `echo` with `max_tokens=0` returns just the prompt: the engine generates one token, which is
dropped (as vLLM), so perplexity can be computed through the API."""
from __future__ import annotations

import dataclasses
import math

from tokenmill.request import CompletionOutput, FinishReason, Logprob, RequestOutput
from tokenmill.server.deltas import ChoiceDelta


@dataclasses.dataclass(frozen=True)
class EchoPrompt:
    text: str  # the prompt as text (decoded when the request sent token ids)
    first_token_text: str  # the first prompt token alone: it has no logprob entry to take it from


def prompt_only(out: RequestOutput) -> RequestOutput:
    """`max_tokens=0`: the generated token dropped; the choice ends for "length"."""
    outs = [CompletionOutput(c.index, "", [], 0.0 if c.logprobs is not None else None,
                             [] if c.logprobs is not None else None,
                             FinishReason.LENGTH.value if c.finish_reason is not None else None)
            for c in out.outputs]
    return dataclasses.replace(out, outputs=outs)


def echo_delta(d: ChoiceDelta, echo: EchoPrompt, out: RequestOutput) -> ChoiceDelta:
    """The prompt before a choice's first delta (its logprobs too, when the delta has logprobs)."""
    lps = None
    if d.logprobs is not None and out.prompt_logprobs is not None:
        lps = list(out.prompt_logprobs) + list(d.logprobs)
    return ChoiceDelta(d.index, echo.text + d.text, list(out.prompt_token_ids) + d.token_ids, lps, d.finish_reason,
                       d.stop_reason)


def prompt_logprobs_json(lps: list[dict[int, Logprob] | None] | None) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob, rank,
    decoded_token}}."""
    if lps is None:
        return None
    return [None if d is None else {str(tid): {"logprob": lp.logprob if math.isfinite(lp.logprob) else -9999.0,
                                               "rank": lp.rank, "decoded_token": lp.decoded_token}
                                    for tid, lp in d.items()}
            for d in lps]
