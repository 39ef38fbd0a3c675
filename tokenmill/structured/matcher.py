"""Each constrained request's grammar state, kept by the runner beside its other request state.

A request that comes back after a preemption is rebuilt from a fresh matcher that consumes the
tokens it already has. When the grammar is complete the mask allows only EOS, so the request ends
with "stop"; a grammar that cannot finish within max_tokens simply ends with "length".
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from llguidance import LLMatcher

from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.backend import GrammarCompiler, get_compiler
from tokenmill.structured.bitmask import GrammarBitmask, fill_bitmask

logger = logging.getLogger(__name__)


@dataclass
class RequestGrammar:
    request_id: str
    matcher: LLMatcher

    def accept(self, tokens: list[int]) -> bool:
        """Advance past sampled tokens; False (and logged) if the grammar refuses one."""
        for token in tokens:
            if self.matcher.is_stopped():  # only EOS is left, and it ends the request
                return True
            if not self.matcher.consume_token(token):
                logger.warning("request %s: the grammar refused token %d: %s", self.request_id, token,
                               self.matcher.get_error().split("\n", 1)[0])
                return False
        return True


class StructuredDecoding:
    """The runner's grammar states, by request id; the compiler is loaded on first use."""

    def __init__(self, tokenizer_path: str, vocab_size: int) -> None:
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.grammars: dict[str, RequestGrammar] = {}

    def compiler(self, eos_token_id: int | None) -> GrammarCompiler:
        return get_compiler(self.tokenizer_path, self.vocab_size, eos_token_id)

    def add(self, request_id: str, params: SamplingParams, eos_token_id: int | None,
            output_token_ids: list[int]) -> None:
        if params.structured_outputs is None:
            return
        grammar = RequestGrammar(request_id, self.compiler(eos_token_id).matcher(params.structured_outputs))
        grammar.accept(output_token_ids)  # resumed after a preemption
        self.grammars[request_id] = grammar

    def remove(self, request_id: str) -> None:
        self.grammars.pop(request_id, None)

    def is_constrained(self, request_id: str) -> bool:
        return request_id in self.grammars

    def bitmask(self, request_ids: list[str]) -> GrammarBitmask | None:
        """Masks for the constrained rows among `request_ids` (a sampler batch), or None."""
        if not self.grammars:
            return None
        rows = [i for i, rid in enumerate(request_ids) if rid in self.grammars]
        if not rows:
            return None
        matchers = [self.grammars[request_ids[i]].matcher for i in rows]
        return GrammarBitmask(rows, fill_bitmask(matchers, self.vocab_size))

    def accept(self, request_id: str, tokens: list[int]) -> None:
        grammar = self.grammars.get(request_id)
        if grammar is not None:
            grammar.accept(tokens)
