"""SamplingParams: how to pick tokens for one request (names follow vLLM)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


MAX_LOGPROBS = 20  # top alternatives per token, for logprobs and prompt_logprobs (vLLM's default cap)
# The sampler works on these per row and step, and bad words are tokenized on the engine thread:
# unbounded lists from one request would slow every step of the batch (50k bad words: +15 ms a step).
MAX_BAD_WORDS = 64
MAX_LOGIT_BIAS = 1024


@dataclass
class StructuredOutputsParams:
    """A constraint on the output (vLLM's names): exactly one of json (a JSON schema, dict or
    string), regex, choice, grammar (Lark or GBNF/EBNF), json_object (any JSON object). The
    whitespace fields shape JSON output: by default none is allowed beyond json.dumps's ", " and
    ": " (a small model given free whitespace can loop on it until max_tokens)."""
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # compact separators "," and ":"
    whitespace_pattern: str | None = None  # a regex: whitespace allowed between JSON tokens

    def __post_init__(self) -> None:
        kinds = self._kinds()
        if len(kinds) != 1:
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, grammar, "
                             f"json_object; got {kinds or 'none'}")
        if self.choice is not None:
            _check(bool(self.choice) and all(isinstance(c, str) for c in self.choice), "structured_outputs",
                   self.choice, "a non-empty list of strings as choice")

    def _kinds(self) -> list[str]:
        """The constraints set: json {} (any JSON) counts, json_object False does not (vLLM)."""
        return [k for k in ("json", "regex", "choice", "grammar", "json_object")
                if (getattr(self, k) if k == "json_object" else getattr(self, k) is not None)]

    @property
    def kind(self) -> str:
        return self._kinds()[0]


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None  # a list after construction, as vLLM
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None  # number of top alternatives per token (0: only the chosen one)
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (vLLM)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100] (OpenAI)
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # their own tokenizations (alone, after a space) are banned (vLLM's)
    # filled by the engine from bad_words with its tokenizer (each word alone and after a space)
    bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    # prefill/decode disaggregation (vLLM's field; see tokenmill/disagg/connector.py)
    kv_transfer_params: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # vLLM's normalisations: stop and stop_token_ids as lists (ids without repeats), seed -1 as
        # None (what OpenAI-style clients send for "random"), logprobs True as 1 (False: none), top_k -1 as 0
        self.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        words = self.bad_words
        self.bad_words = [words] if isinstance(words, str) else list(dict.fromkeys(words or []))
        if isinstance(self.allowed_token_ids, list):
            self.allowed_token_ids = list(dict.fromkeys(self.allowed_token_ids))
        if self.seed == -1 and not isinstance(self.seed, bool):
            self.seed = None
        for name in ("logprobs", "prompt_logprobs"):
            if isinstance(getattr(self, name), bool):
                setattr(self, name, 1 if getattr(self, name) else None)
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    @property
    def stop_list(self) -> list[str]:
        return self.stop

    def _validate(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            _check(_is_int(getattr(self, name)), name, getattr(self, name), "an integer")
        _check(self.max_tokens is None or _is_int(self.max_tokens), "max_tokens", self.max_tokens, "an integer or None")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), name,
                   value, "a finite number")
        _check(self.n >= 1, "n", self.n, "an integer >= 1")
        _check(0.0 <= self.temperature <= 100.0, "temperature", self.temperature, "[0, 100]")
        _check(0.0 < self.top_p <= 1.0, "top_p", self.top_p, "(0, 1]")
        _check(self.top_k >= 0, "top_k", self.top_k, "-1, 0 (disabled) or a positive integer")
        _check(0.0 <= self.min_p <= 1.0, "min_p", self.min_p, "[0, 1]")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", self.presence_penalty, "[-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", self.frequency_penalty, "[-2, 2]")
        _check(0.0 < self.repetition_penalty, "repetition_penalty", self.repetition_penalty, "> 0")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", self.max_tokens, "an integer >= 1")
        _check(self.min_tokens >= 0, "min_tokens", self.min_tokens, "an integer >= 0")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens", self.min_tokens,
               "<= max_tokens")
        _check(self.logprobs is None or _is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               self.logprobs, f"0..{MAX_LOGPROBS} or None")
        _check(self.prompt_logprobs is None or _is_int(self.prompt_logprobs)
               and 0 <= self.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs", self.prompt_logprobs,
               f"0..{MAX_LOGPROBS} (top alternatives per prompt token) or None")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings")
        _check(all(_is_int(t) for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids, "integers")
        bias = self.logit_bias
        _check(bias is None or isinstance(bias, dict) and all(
            _is_int(t) and isinstance(v, (int, float)) and not isinstance(v, bool) and -100 <= v <= 100
            for t, v in bias.items()) and len(bias) <= MAX_LOGIT_BIAS, "logit_bias", _short(bias),
               f"a dict of at most {MAX_LOGIT_BIAS} token id -> bias in [-100, 100]")
        allowed = self.allowed_token_ids
        _check(allowed is None or isinstance(allowed, list) and allowed and all(_is_int(t) for t in allowed),
               "allowed_token_ids", allowed, "a non-empty list of token ids or None")
        _check(all(isinstance(w, str) and w.strip() for w in self.bad_words) and len(self.bad_words) <= MAX_BAD_WORDS,
               "bad_words", _short(self.bad_words), f"at most {MAX_BAD_WORDS} non-empty strings")
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", self.structured_outputs, "a StructuredOutputsParams or None")
        # the grammar decides where a constrained output ends: a forbidden EOS could leave no token at all
        _check(self.structured_outputs is None or self.min_tokens == 0, "min_tokens", self.min_tokens,
               "0 with structured_outputs")
        _check(self.seed is None or (_is_int(self.seed) and -2**63 <= self.seed < 2**63 - self.n),
               "seed", self.seed, "an integer in [-2**63, 2**63 - n) or None")
        if self.kv_transfer_params is not None:
            self._validate_kv_transfer()

    def _validate_kv_transfer(self) -> None:
        p = self.kv_transfer_params
        _check(isinstance(p, dict), "kv_transfer_params", p, "an object")
        decode, prefill = bool(p.get("do_remote_decode")), bool(p.get("do_remote_prefill"))
        _check(not (decode and prefill), "kv_transfer_params", p, "do_remote_decode or do_remote_prefill, not both")
        _check(not (decode or prefill) or self.n == 1, "n", self.n, "1 with kv_transfer_params")
        _check(not decode or self.max_tokens == 1, "max_tokens", self.max_tokens,
               "1 with kv_transfer_params.do_remote_decode (the prefill engine samples one token)")
        timeout = p.get("timeout_s")
        _check(timeout is None or (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                                   and timeout >= 0), "kv_transfer_params.timeout_s", timeout, "a number >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def shapes_logits(self) -> bool:
        """logit_bias, allowed_token_ids or bad_words: the sampler changes this row's logits."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words_token_ids)

    @property
    def uses_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


@dataclass
class BeamSearchParams:
    """LLM.beam_search's parameters (vLLM's; tokenmill/beam_search.py)."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # of each step's drawn token (one more candidate); logprobs stay the raw model's
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # vLLM's field; beams end on end ids only
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        most = MAX_LOGPROBS // 2
        if not (isinstance(self.beam_width, int) and 1 <= self.beam_width <= most):
            raise ValueError(f"beam_width must be an integer in [1, {most}] (2 x beam_width alternatives per step, "
                             f"at most {MAX_LOGPROBS} logprobs), got {self.beam_width!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")


def _short(value: object) -> object:
    """A long list or dict, shortened for an error message."""
    if isinstance(value, (list, dict)) and len(value) > 8:
        return f"{type(value).__name__} of {len(value)} entries"
    return value


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
