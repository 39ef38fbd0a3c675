"""Between the benchmark harness and the simulator: bench workloads (or a trace) become timed
`SimRequest`s with token ids, and simulated requests become the harness's `RequestResult`s, so
`tokenmill sim` writes the same results.json / report.md as `tokenmill bench serve`."""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from tokenmill.bench.client import RequestResult
from tokenmill.bench.workloads import WORDS, BenchRequest
from tokenmill.sim.simulator import SimRequest, SimResult

_WORD_IDS = {w: i for i, w in enumerate(WORDS)}


def word_ids(text: str) -> list[int]:
    """Token ids without a tokenizer: one per word (the harness builds prompts of one-token words),
    stable across runs, so equal prefixes give equal ids (the prefix cache sees what a server would)."""
    return [_WORD_IDS.get(w, 1000 + zlib.crc32(w.encode("utf-8")) % 48000) for w in text.split()]


class TokenCounter:
    """Prompt text -> the token ids the server's engine would see: the tokenizer's (through the
    model's chat template for the chat endpoint) when one is given, else `word_ids`."""

    def __init__(self, tokenizer: Any | None = None, chat: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat = chat

    def __call__(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return word_ids(text)
        if self.chat:
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                           add_generation_prompt=True, tokenize=True))
        return list(self.tokenizer.encode(text, add_special_tokens=True))


def to_sim_requests(requests: Sequence[BenchRequest], offsets: Sequence[float],
                    tokens: TokenCounter) -> list[SimRequest]:
    return [SimRequest(str(i), float(off), tokens(r.prompt), r.output_len, r.group)
            for i, (r, off) in enumerate(zip(requests, offsets))]


def to_request_results(sims: Sequence[SimResult], requests: Sequence[BenchRequest]) -> list[RequestResult]:
    out = []
    for i, (s, r) in enumerate(zip(sims, requests)):
        res = RequestResult(i, r.input_len, r.output_len, s.arrival, start_s=s.arrival, success=True,
                            status_code=200, prompt_tokens=s.prompt_len, output_tokens=len(s.token_times),
                            usage_reported=True, num_chunks=len(s.token_times))
        res.ttft_s = s.ttft
        res.e2e_s = s.e2e
        res.itl_s = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
        out.append(res)
    return out


def run_duration(sims: Sequence[SimResult]) -> float:
    """First arrival to last token, as the harness's wall clock (first send to last completion)."""
    if not sims:
        return 0.0
    return max(s.token_times[-1] for s in sims) - min(s.arrival for s in sims)
