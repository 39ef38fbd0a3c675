"""What the completions and chat endpoints share: the model-name check, request checks,
SamplingParams, handing requests to the engine, waiting for them, and usage."""
from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.engine.ended_usage import EndedUsage, RecentMap
from tokenmill.engine.request_stream import RequestStream
from tokenmill.request import RequestOutput
from tokenmill.sampling_params import SamplingParams, StructuredOutputsParams
from tokenmill.server.disconnect import ClientGone, collect
from tokenmill.server.errors import APIError, aliased_message, engine_error, param_of
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.server.sse import sse_json
from tokenmill.server.tokenization import PromptTokenizer

logger = logging.getLogger("tokenmill.server")

MAX_N = 128  # choices per request
# Stop checks run on every new token of the request, inside the step every request waits for:
# without a cap, one body of 60k stop strings made a 200-token request 17x slower (and the batch).
MAX_STOP_STRINGS = 64  # OpenAI allows 4
MAX_STOP_TOKEN_IDS = 256

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "seed")


class OpenAIServing:
    log_prompts = False  # --log-prompts: otherwise no prompt text or ids ever reach the log

    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], tokenizer: PromptTokenizer,
                 request_ids: RecentMap[str, list[str]] | None = None) -> None:
        self.engine = engine
        self.served_model_names = list(served_model_names)
        self.tokenizer = tokenizer
        # X-Request-Id -> the engine's request ids (POST /abort_request finds them here)
        self.request_ids = request_ids if request_ids is not None else RecentMap()

    def _remember_ids(self, raw: Request | None, ids: list[str]) -> None:
        http_id = raw.scope.get("state", {}).get("request_id") if raw is not None else None
        if http_id:
            self.request_ids.record(http_id, ids)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"{', '.join(self.served_model_names)}", "not_found_error", "model",
                           "model_not_found")

    def _common_checks(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        """What SamplingParams and the engine do not check (value ranges are theirs)."""
        if not 1 <= req.n <= MAX_N:
            raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {req.n}", param="n")
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if isinstance(req.stop, list) and len(req.stop) > MAX_STOP_STRINGS:
            raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} strings, got {len(req.stop)}", param="stop")
        if req.stop_token_ids and len(req.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise APIError(400, f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got {len(req.stop_token_ids)}",
                           param="stop_token_ids")

    def _sampling_params(self, req: CompletionRequest | ChatCompletionRequest, max_tokens: int | None,
                         logprobs: int | None, aliases: dict[str, str],
                         structured: StructuredOutputsParams | None = None,
                         prompt_logprobs: int | None = None) -> SamplingParams:
        kwargs: dict[str, Any] = dict(n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens,
                                      ignore_eos=req.ignore_eos, stop=req.stop, stop_token_ids=req.stop_token_ids,
                                      skip_special_tokens=req.skip_special_tokens,
                                      include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
                                      structured_outputs=structured, prompt_logprobs=prompt_logprobs,
                                      kv_transfer_params=req.kv_transfer_params, logit_bias=_logit_bias(req.logit_bias),
                                      allowed_token_ids=req.allowed_token_ids, bad_words=req.bad_words)
        # a field the request leaves unset takes the model's default (generation_config.json), as vLLM
        defaults = self.engine.generation_defaults
        kwargs.update({name: defaults[name] for name in _SAMPLING_FIELDS if name in defaults})
        kwargs.update({name: getattr(req, name) for name in _SAMPLING_FIELDS if getattr(req, name) is not None})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as e:
            raise APIError(400, aliased_message(str(e), aliases), param=param_of(str(e), aliases)) from None

    async def _add(self, requests: list[tuple[str, Any, SamplingParams]], arrival: float,
                   aliases: dict[str, str]) -> RequestStream:
        if self.log_prompts:
            for rid, prompt, params in requests:
                logger.info("request %s: prompt %r, %s", rid, prompt, params)
        try:
            return await self.engine.add_requests(requests, arrival_time=arrival)
        except Exception as e:
            raise engine_error(e, aliases) from None

    @staticmethod
    async def _final_outputs(stream: RequestStream, raw: Request | None) -> dict[str, RequestOutput] | None:
        """The final outputs, or None if the client disconnected first (the requests are aborted)."""
        try:
            return await collect(stream, raw)
        except ClientGone:
            return None
        except Exception as e:
            raise engine_error(e) from None

    @staticmethod
    def _error_event(e: BaseException) -> str:
        return sse_json(engine_error(e).body())


def usage(outputs: list[RequestOutput]) -> dict:
    cached = sum(o.num_cached_tokens for o in outputs)
    return {**running_usage(outputs), "prompt_tokens_details": {"cached_tokens": cached},
            "tokenmill": engine_usage(outputs)}


def engine_usage(outputs: list[RequestOutput]) -> dict:
    """tokenmill's usage extension, what a fleet in front bills and routes by: the device-seconds
    the requests were charged (their share, by tokens, of every engine step they were in; see
    RequestEvents) and the engine's own TTFT / TPOT (the slowest prompt's TTFT, the mean TPOT)."""
    ms = [o.metrics for o in outputs if o.metrics is not None]
    ttfts = [m.first_token_time - m.arrival_time for m in ms if m.first_token_time is not None]
    n_out = [sum(len(c.token_ids) for c in o.outputs) for o in outputs if o.metrics is not None]
    tpots = [(m.last_token_time - m.first_token_time) / (n - 1) for m, n in zip(ms, n_out)
             if n >= 2 and m.first_token_time is not None and m.last_token_time is not None]
    return {"prefill_device_seconds": sum(m.prefill_device_seconds for m in ms),
            "decode_device_seconds": sum(m.decode_device_seconds for m in ms),
            "ttft_s": max(ttfts) if ttfts else None,
            "tpot_s": sum(tpots) / len(tpots) if tpots else None}


def ended_usage_body(usages: list[EndedUsage]) -> dict:
    """`usage` (with usage.tokenmill's device-seconds) of ended requests, aborted ones included."""
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(u.cached_tokens for u in usages)},
            "tokenmill": {"prefill_device_seconds": sum(u.prefill_device_seconds for u in usages),
                          "decode_device_seconds": sum(u.decode_device_seconds for u in usages),
                          "ttft_s": None, "tpot_s": None}}


def kv_transfer_field(outputs: list[RequestOutput]) -> dict:
    """A prefill engine's hand-over (vLLM's top-level "kv_transfer_params"), when there is one."""
    params = next((o.kv_transfer_params for o in outputs if o.kv_transfer_params is not None), None)
    return {"kv_transfer_params": params} if params is not None else {}


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias has token ids as JSON object keys (strings)."""
    if not bias:
        return None
    try:
        return {int(k): v for k, v in bias.items()}
    except ValueError:
        raise APIError(400, f"logit_bias keys must be token ids, got {list(bias)[:3]}", param="logit_bias") from None


def chunk(head: dict, choices: list[dict], include_usage: bool, running: list[RequestOutput] | None = None) -> str:
    """One streamed chunk; with include_usage every chunk but the last carries "usage": null, or
    with continuous_usage_stats (`running`: the outputs so far) the counts up to this chunk, as vLLM."""
    body = {**head, "choices": choices}
    if include_usage:
        body["usage"] = running_usage(running) if running else None
    return sse_json(body)


def continuous_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage and req.stream_options.continuous_usage_stats)


def running_usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
