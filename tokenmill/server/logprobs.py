"""Engine logprobs -> the OpenAI `logprobs` objects of completions and of chat completions."""
from __future__ import annotations

import math

from tokenmill.request import Logprob

_FLOOR = -9999.0  # what OpenAI reports for -inf (JSON has no infinity)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else _FLOOR


def _chosen_text(chosen: Logprob | None) -> str:
    return chosen.decoded_token if chosen and chosen.decoded_token is not None else ""


def _ranked(d: dict[int, Logprob], k: int) -> list[Logprob]:
    return sorted((lp for lp in d.values() if lp.rank is not None), key=lambda lp: lp.rank)[:k]


def completion_logprobs(lps: list[dict[int, Logprob] | None] | None, token_ids: list[int], k: int,
                        offset: int, unscored_text: str = "") -> dict | None:
    """/v1/completions: tokens, token_logprobs, top_logprobs (k alternatives), text_offset. A None
    entry (an echoed prompt's first token, `unscored_text`) has null logprob and alternatives."""
    if lps is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    for tid, d in zip(token_ids, lps):
        if d is None:
            tokens.append(unscored_text)
            token_logprobs.append(None)
            top.append(None)
            offsets.append(offset)
            offset += len(unscored_text)
            continue
        chosen = d.get(tid)
        text = _chosen_text(chosen)
        tokens.append(text)
        token_logprobs.append(_finite(chosen.logprob) if chosen else None)
        entry = {lp.decoded_token or "": _finite(lp.logprob) for lp in _ranked(d, k)}
        if chosen is not None:
            entry.setdefault(text, _finite(chosen.logprob))
        top.append(entry)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(lps: list[dict[int, Logprob]] | None, token_ids: list[int], k: int) -> dict | None:
    """/v1/chat/completions: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    if lps is None:
        return None
    content = []
    for tid, d in zip(token_ids, lps):
        chosen = d.get(tid)
        text = _chosen_text(chosen)
        content.append({"token": text, "logprob": _finite(chosen.logprob) if chosen else _FLOOR,
                        "bytes": list(text.encode("utf-8")),
                        "top_logprobs": [{"token": lp.decoded_token or "", "logprob": _finite(lp.logprob),
                                          "bytes": list((lp.decoded_token or "").encode("utf-8"))}
                                         for lp in _ranked(d, k)]})
    return {"content": content}
