"""The one place a request is checked against the model before it is queued (the server and LLM
both go through it). SamplingParams checks its own fields' ranges; this checks what depends on the
model: token ids in the vocabulary, the context length, the KV cache."""
from __future__ import annotations

from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.backend import GrammarCompiler, GrammarError


class RequestValidationError(ValueError):
    """A request the engine refuses; `param` names the request field at fault (or None)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def check_request(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int,
                  kv_capacity_tokens: int, clamp_max_tokens: bool = False) -> int:
    """Raises RequestValidationError; returns the output token limit (max_tokens, or when it is
    None, all the room the context and the KV cache leave). clamp_max_tokens (LLM's, as vLLM
    offline): a max_tokens past that room ends the output there instead of refusing the request."""
    _check_token_ids("prompt", prompt_token_ids, vocab_size)
    _check_token_ids("stop_token_ids", params.stop_token_ids, vocab_size)
    _check_token_ids("logit_bias", list(params.logit_bias or ()), vocab_size)
    _check_token_ids("allowed_token_ids", params.allowed_token_ids or [], vocab_size)
    n = len(prompt_token_ids)
    limit = min(max_model_len, kv_capacity_tokens)
    if n >= limit:
        raise RequestValidationError(
            f"This model's maximum context length is {max_model_len} tokens"
            + (f" (the KV cache holds {kv_capacity_tokens})" if kv_capacity_tokens < max_model_len else "")
            + f". However, your request has {n} input tokens. Please reduce the length of the input.", "prompt")
    if params.max_tokens is None or clamp_max_tokens:
        return min(limit - n, params.max_tokens or limit)
    if n + params.max_tokens > max_model_len:
        raise RequestValidationError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n + params.max_tokens} tokens ({n} in the input, {params.max_tokens} in the completion). "
            "Please reduce the length of the input or completion.", "max_tokens")
    if n + params.max_tokens > kv_capacity_tokens:
        raise RequestValidationError(
            f"request needs up to {n + params.max_tokens} tokens of KV cache but the whole cache holds "
            f"{kv_capacity_tokens}; lower max_tokens or raise kv_cache_memory_gb", "max_tokens")
    return params.max_tokens


def check_structured_outputs(params: SamplingParams, compiler: GrammarCompiler) -> None:
    """Compile the request's constraint (cached for the runner); an invalid one is refused here."""
    if params.structured_outputs is None:
        return
    try:
        compiler.compile(params.structured_outputs)
    except GrammarError as e:
        raise RequestValidationError(f"invalid {params.structured_outputs.kind} constraint: {e}", e.param) from None


def _check_token_ids(field: str, ids: list[int], vocab_size: int) -> None:
    if field == "prompt" and not ids:
        raise RequestValidationError("prompt_token_ids must not be empty", "prompt")
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size]
    if bad:
        name = "prompt_token_ids" if field == "prompt" else field
        raise RequestValidationError(f"{name} must be integers in [0, {vocab_size}); got {bad[:3]}", field)
