"""Cumulative engine outputs -> per-choice deltas for streaming responses."""
from __future__ import annotations

from dataclasses import dataclass

from tokenmill.request import Logprob, RequestOutput


@dataclass
class ChoiceDelta:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: str | int | None


class OutputDeltas:
    """Turns the cumulative outputs of one request into per-choice deltas (text, token ids,
    logprobs), each emitted once; a choice's finish_reason is set on its last delta."""

    def __init__(self) -> None:
        self._text_len: dict[int, int] = {}
        self._num_tokens: dict[int, int] = {}
        self._done: set[int] = set()

    def update(self, out: RequestOutput) -> list[ChoiceDelta]:
        deltas = []
        for c in out.outputs:
            if c.index in self._done:
                continue
            t0, n0 = self._text_len.get(c.index, 0), self._num_tokens.get(c.index, 0)
            text, ids = c.text[t0:], c.token_ids[n0:]
            finished = c.finish_reason is not None
            if not text and not ids and not finished:
                continue
            self._text_len[c.index], self._num_tokens[c.index] = len(c.text), len(c.token_ids)
            if finished:
                self._done.add(c.index)
            lps = c.logprobs[n0:] if c.logprobs is not None else None
            deltas.append(ChoiceDelta(c.index, text, ids, lps, c.finish_reason, c.stop_reason))
        return deltas
