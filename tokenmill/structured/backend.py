"""Constraints (StructuredOutputsParams) -> llguidance grammars -> compiled matchers, cached.

Compiling a grammar builds its parser over the tokenizer's token trie (milliseconds for a JSON
schema); every request with the same grammar then starts from a copy of one compiled template
(microseconds). The frontend compiles when it validates a request (an invalid constraint is a 400
before anything is queued); the runner, in the same process, finds it in the cache.
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import llguidance
from llguidance import LLMatcher, LLTokenizer

from tokenmill.sampling_params import StructuredOutputsParams

MAX_CACHED_GRAMMARS = 256
MAX_ERROR_CHARS = 400

# JSON as json.dumps writes it: a small model given free whitespace can emit it until max_tokens
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """An invalid schema, regex, choice or grammar; `param` names the request field."""

    def __init__(self, message: str, param: str = "structured_outputs") -> None:
        super().__init__(message)
        self.param = param


def json_options(params: StructuredOutputsParams) -> dict:
    if params.whitespace_pattern:
        return {"whitespace_flexible": True, "whitespace_pattern": params.whitespace_pattern}
    if params.disable_any_whitespace:
        return {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    return dict(COMPACT_JSON)


def load_schema(schema: str | dict) -> dict:
    if isinstance(schema, dict):
        return schema
    try:
        loaded = json.loads(schema)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(loaded, (dict, bool)):
        raise GrammarError(f"a JSON schema must be an object, got {type(loaded).__name__}")
    return loaded


def grammar_spec(params: StructuredOutputsParams) -> str:
    """The llguidance grammar (a JSON string) for one constraint."""
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = load_schema(params.json) if kind == "json" else {"type": "object"}
        return LLMatcher.grammar_from_json_schema(schema, defaults=json_options(params))
    if kind == "regex":
        return LLMatcher.grammar_from_regex(params.regex)
    if kind == "choice":
        return LLMatcher.grammar_from_lark(choice_lark(params.choice))
    try:  # Lark, or GBNF/EBNF (llama.cpp's syntax, recognized by its "::=")
        return llguidance.grammar_from("grammar", params.grammar)
    except ValueError as e:
        raise GrammarError(str(e)) from None


def choice_lark(choices: list[str]) -> str:
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


@dataclass
class CompileStats:
    hits: int = 0
    misses: int = 0
    compile_s: float = 0.0  # total time spent compiling (misses)


class GrammarCompiler:
    """Compiles grammars for one tokenizer; keeps the newest MAX_CACHED_GRAMMARS compiled templates."""

    def __init__(self, tokenizer: LLTokenizer, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self.tokenizer = tokenizer
        self.max_cached = max_cached
        self.stats = CompileStats()
        self._cache: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def compile(self, params: StructuredOutputsParams) -> LLMatcher:
        """The compiled template for `params` (never consume tokens on it: take `matcher()`)."""
        return self.compile_spec(grammar_spec(params))

    def compile_spec(self, spec: str) -> LLMatcher:
        with self._lock:
            template = self._cache.get(spec)
            if template is not None:
                self._cache.move_to_end(spec)
                self.stats.hits += 1
                return template
        t0 = time.perf_counter()
        template = LLMatcher(self.tokenizer, spec, log_level=0)
        if template.is_error():
            raise GrammarError(_short(template.get_error()))
        with self._lock:
            self.stats.misses += 1
            self.stats.compile_s += time.perf_counter() - t0
            self._cache[spec] = template
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return template

    def matcher(self, params: StructuredOutputsParams) -> LLMatcher:
        """A fresh matcher for one request."""
        return self.compile(params).deep_copy()

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()


def _short(error: str) -> str:
    """llguidance's errors append the parser state and the whole grammar: keep the message."""
    message = error.split("\n<state>", 1)[0].strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."


@lru_cache(maxsize=8)
def get_compiler(tokenizer_path: str, vocab_size: int, eos_token_id: int | None) -> GrammarCompiler:
    """One compiler per tokenizer in this process, built on first use (loading the tokenizer's
    token trie takes a few hundred ms)."""
    import llguidance.hf  # imports transformers: only once a constraint is used

    from tokenmill.engine.tokenizer import load_tokenizer
    hf = load_tokenizer(tokenizer_path)
    return GrammarCompiler(llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos_token_id))
