"""OpenAI completions and chat completions over the AsyncLLMEngine: requests -> SamplingParams and
prompts, engine outputs -> response bodies or SSE chunks."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tokenmill.engine.async_engine import (
    AsyncLLMEngine,
    EngineDeadError,
    EngineShutdownError,
    OutputDeltas,
    QueueFullError,
    RequestStream,
)
from tokenmill.request import Logprob, RequestOutput
from tokenmill.sampling_params import SamplingParams
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest, error_body

logger = logging.getLogger(__name__)

MAX_N = 128  # choices per request
MAX_PROMPTS = 256  # prompts in one completions request
_SEED_MAX = 2**63 - 1 - MAX_N  # the sampler seeds torch with seed + choice index
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class APIError(Exception):
    """An error answered with an OpenAI error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def engine_error(e: BaseException) -> APIError:
    """Map an engine exception to an APIError (never a 500 for a client's mistake)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFullError):
        return APIError(429, str(e), "rate_limit_error", None, "rate_limit_exceeded",
                        {"Retry-After": str(e.retry_after)})
    if isinstance(e, EngineDeadError):
        return APIError(503, str(e), "service_unavailable", None, "engine_dead")
    if isinstance(e, EngineShutdownError):
        return APIError(503, str(e), "service_unavailable", None, "shutting_down")
    if isinstance(e, ValueError):
        return APIError(400, str(e), param=_param_of(str(e)))
    logger.exception("unexpected engine error", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")


_PARAM_NAMES = {"n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                "repetition_penalty", "max_tokens", "min_tokens", "logprobs", "stop", "seed", "stop_token_ids",
                "prompt", "prompt_token_ids", "request"}


def _param_of(message: str, aliases: dict[str, str] | None = None) -> str | None:
    """The request field a SamplingParams/engine ValueError is about (its message starts with it)."""
    word = message.split(" ", 1)[0].strip(":,")
    if word not in _PARAM_NAMES:
        return None
    word = {"prompt_token_ids": "prompt", "request": "max_tokens"}.get(word, word)
    return (aliases or {}).get(word, word)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """StreamingResponse that always watches for the client going away while streaming, and closes
    the body iterator whatever happens (so its `finally` aborts the engine requests at once)."""

    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-send
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def _wait_disconnect(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


class ClientGone(Exception):
    pass


async def collect(stream: RequestStream, raw: Request | None) -> dict[str, RequestOutput]:
    """The final output of every request of the stream; aborts them if the client disconnects."""
    latest: dict[str, RequestOutput] = {}

    async def consume() -> None:
        while not stream.finished:
            for out in await stream.next_outputs():
                latest[out.request_id] = out

    task = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(_wait_disconnect(raw)) if raw is not None else None
    try:
        done, _ = await asyncio.wait({task} | ({watch} if watch else set()), return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            return latest
        raise ClientGone()
    finally:
        task.cancel()
        if watch is not None:
            watch.cancel()
        stream.abort()


def _usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], chat_template: str | None = None):
        self.engine = engine
        self.served_model_names = list(served_model_names)
        self.chat_template = chat_template

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    # -- shared -------------------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"{', '.join(self.served_model_names)}", "not_found_error", "model",
                           "model_not_found")

    def _common_checks(self, req) -> None:
        if not 1 <= req.n <= MAX_N:
            raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {req.n}", param="n")
        if req.seed is not None and not -(2**63) <= req.seed <= _SEED_MAX:
            raise APIError(400, f"seed must be in [-2**63, {_SEED_MAX}], got {req.seed}", param="seed")
        if req.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        vocab = self.engine.vocab_size
        bad = [t for t in req.stop_token_ids or [] if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"stop_token_ids must be in [0, {vocab}); got {bad[:3]}", param="stop_token_ids")

    def _sampling_params(self, req, max_tokens: int | None, logprobs: int | None,
                         aliases: dict[str, str]) -> SamplingParams:
        kwargs: dict[str, Any] = dict(n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens,
                                      ignore_eos=req.ignore_eos, stop=req.stop, stop_token_ids=req.stop_token_ids,
                                      skip_special_tokens=req.skip_special_tokens,
                                      include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs)
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "seed"):
            value = getattr(req, name)
            if value is not None:
                kwargs[name] = value
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), param=_param_of(str(e), aliases)) from None

    async def _add(self, requests: list[tuple[str, Any, SamplingParams]], arrival: float,
                   aliases: dict[str, str]) -> RequestStream:
        try:
            return await self.engine.add_requests(requests, arrival_time=arrival)
        except Exception as e:
            err = engine_error(e)
            if err.param is not None:
                err.param = aliases.get(err.param, err.param)
            raise err from None

    @staticmethod
    def _error_event(e: BaseException) -> str:
        err = engine_error(e) if not isinstance(e, APIError) else e
        return _sse(err.body())

    # -- /v1/completions ------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, raw: Request | None, arrival: float) -> Response:
        self._check_model(req.model)
        self._common_checks(req)
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of must equal n (beam search is not supported)", param="best_of")
        prompts = self._prompts(req.prompt)
        params = self._sampling_params(req, req.max_tokens, req.logprobs, {})
        base = f"cmpl-{uuid.uuid4().hex}"
        ids = [f"{base}-{i}" for i in range(len(prompts))]
        stream = await self._add(list(zip(ids, prompts, [params] * len(prompts))), arrival, {})
        created = int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._completion_stream(stream, ids, base, created, req, include_usage),
                               headers=SSE_HEADERS)
        try:
            final = await collect(stream, raw)
        except ClientGone:
            return Response(status_code=499)
        except Exception as e:
            raise engine_error(e) from None
        outs = [final[i] for i in ids]
        choices = []
        for p, out in enumerate(outs):
            for c in out.outputs:
                choice = {"index": p * req.n + c.index, "text": c.text,
                          "logprobs": self._completion_logprobs(c.logprobs, c.token_ids, req.logprobs, 0)
                          if req.logprobs is not None else None,
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                if req.return_token_ids:
                    choice["prompt_token_ids"] = out.prompt_token_ids
                    choice["token_ids"] = c.token_ids
                choices.append(choice)
        return JSONResponse({"id": base, "object": "text_completion", "created": created, "model": self.model_name,
                             "choices": choices, "usage": _usage(outs)})

    def _prompts(self, prompt) -> list:
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]
        if len(prompt) > MAX_PROMPTS:
            raise APIError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", param="prompt")
        return [p if isinstance(p, str) else list(p) for p in prompt]

    async def _completion_stream(self, stream: RequestStream, ids: list[str], base: str, created: int,
                                 req: CompletionRequest, include_usage: bool) -> AsyncIterator[str]:
        deltas = {rid: OutputDeltas() for rid in ids}
        index_of = {rid: p for p, rid in enumerate(ids)}
        offsets: dict[int, int] = {}
        latest: dict[str, RequestOutput] = {}
        head = {"id": base, "object": "text_completion", "created": created, "model": self.model_name}
        try:
            try:
                while not stream.finished:
                    for out in await stream.next_outputs():
                        latest[out.request_id] = out
                        p = index_of[out.request_id]
                        for d in deltas[out.request_id].update(out):
                            if not (d.text or d.finish_reason or req.logprobs is not None or req.return_token_ids):
                                continue  # held-back text (partial character, possible stop string)
                            idx = p * req.n + d.index
                            choice = {"index": idx, "text": d.text, "logprobs": None,
                                      "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
                            if req.logprobs is not None and d.logprobs is not None:
                                choice["logprobs"] = self._completion_logprobs(d.logprobs, d.token_ids,
                                                                               req.logprobs, offsets.get(idx, 0))
                            offsets[idx] = offsets.get(idx, 0) + len(d.text)
                            if req.return_token_ids:
                                choice["token_ids"] = d.token_ids
                            chunk = {**head, "choices": [choice]}
                            if include_usage:
                                chunk["usage"] = None
                            yield _sse(chunk)
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": _usage([latest[i] for i in ids])})
            except Exception as e:
                yield self._error_event(e)
            yield SSE_DONE
        finally:
            stream.abort()

    def _completion_logprobs(self, lps: list[dict[int, Logprob]] | None, token_ids: list[int], k: int,
                             offset: int) -> dict | None:
        if lps is None:
            return None
        tokens, token_logprobs, top, offsets = [], [], [], []
        for tid, d in zip(token_ids, lps):
            chosen = d.get(tid)
            text = chosen.decoded_token if chosen and chosen.decoded_token is not None else ""
            tokens.append(text)
            token_logprobs.append(_finite(chosen.logprob) if chosen else None)
            ranked = sorted((lp for lp in d.values() if lp.rank is not None), key=lambda lp: lp.rank)[:k]
            entry = {lp.decoded_token or "": _finite(lp.logprob) for lp in ranked}
            if chosen is not None:
                entry.setdefault(text, _finite(chosen.logprob))
            top.append(entry)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

    # -- /v1/chat/completions -------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest, raw: Request | None, arrival: float) -> Response:
        self._check_model(req.model)
        self._common_checks(req)
        if req.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format {\"type\": \"text\"} is supported", param="response_format")
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        prompt_ids = self._chat_prompt(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if max_tokens is None:  # as much as fits in the context and in the whole KV cache
            room = min(self.engine.max_model_len, self.engine.kv_capacity_tokens) - len(prompt_ids)
            max_tokens = room if room >= 1 else None
        aliases = {"logprobs": "top_logprobs", "prompt": "messages", "max_tokens": max_param}
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self._sampling_params(req, max_tokens, logprobs, aliases)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await self._add([(rid, {"prompt_token_ids": prompt_ids}, params)], arrival, aliases)
        created = int(time.time())
        top_k = req.top_logprobs or 0
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(self._chat_stream(stream, rid, created, req, include_usage, top_k), headers=SSE_HEADERS)
        try:
            final = await collect(stream, raw)
        except ClientGone:
            return Response(status_code=499)
        except Exception as e:
            raise engine_error(e) from None
        out = final[rid]
        choices = []
        for c in out.outputs:
            choice = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                      "logprobs": self._chat_logprobs(c.logprobs, c.token_ids, top_k) if req.logprobs else None,
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        body = {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": _usage([out])}
        if req.return_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        return JSONResponse(body)

    def _chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        messages = []
        for i, m in enumerate(req.messages):
            msg = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                texts = []
                for part in m.content:
                    if part.type != "text" or part.text is None:
                        raise APIError(400, f"messages[{i}].content: only text parts are supported, got "
                                            f"{part.type!r}", param="messages")
                    texts.append(part.text)
                msg["content"] = "".join(texts)
            messages.append(msg)
        tok = self.engine.tokenizer
        kwargs = dict(req.chat_template_kwargs or {})
        if req.continue_final_message:
            kwargs["continue_final_message"] = True
        try:
            ids = tok.apply_chat_template(messages, chat_template=self.chat_template, tokenize=True,
                                          add_generation_prompt=req.add_generation_prompt and
                                          not req.continue_final_message, **kwargs)
        except Exception as e:
            hint = "" if getattr(tok, "chat_template", None) or self.chat_template else \
                " (this model's tokenizer has no chat template: start the server with --chat-template)"
            raise APIError(400, f"cannot apply the chat template: {e}{hint}", param="messages") from None
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        if ids and isinstance(ids[0], list):  # some tokenizers return a batch of one
            ids = ids[0]
        if not ids:
            raise APIError(400, "the chat template produced an empty prompt", param="messages")
        return ids

    async def _chat_stream(self, stream: RequestStream, rid: str, created: int, req: ChatCompletionRequest,
                           include_usage: bool, top_k: int) -> AsyncIterator[str]:
        deltas = OutputDeltas()
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        latest: RequestOutput | None = None

        def chunk(choices: list) -> str:
            body = {**head, "choices": choices}
            if include_usage:
                body["usage"] = None
            return _sse(body)

        try:
            try:
                for i in range(req.n):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])
                while not stream.finished:
                    for out in await stream.next_outputs():
                        latest = out
                        for d in deltas.update(out):
                            if not (d.text or d.finish_reason or req.logprobs or req.return_token_ids):
                                continue  # held-back text (partial character, possible stop string)
                            choice = {"index": d.index, "delta": {"content": d.text} if d.text else {},
                                      "logprobs": None, "finish_reason": d.finish_reason,
                                      "stop_reason": d.stop_reason}
                            if req.logprobs and d.logprobs is not None:
                                choice["logprobs"] = self._chat_logprobs(d.logprobs, d.token_ids, top_k)
                            if req.return_token_ids:
                                choice["token_ids"] = d.token_ids
                            yield chunk([choice])
                if include_usage and latest is not None:
                    yield _sse({**head, "choices": [], "usage": _usage([latest])})
            except Exception as e:
                yield self._error_event(e)
            yield SSE_DONE
        finally:
            stream.abort()

    @staticmethod
    def _chat_logprobs(lps: list[dict[int, Logprob]] | None, token_ids: list[int], k: int) -> dict | None:
        if lps is None:
            return None
        content = []
        for tid, d in zip(token_ids, lps):
            chosen = d.get(tid)
            text = chosen.decoded_token if chosen and chosen.decoded_token is not None else ""
            ranked = sorted((lp for lp in d.values() if lp.rank is not None), key=lambda lp: lp.rank)[:k]
            content.append({"token": text, "logprob": _finite(chosen.logprob) if chosen else -9999.0,
                            "bytes": list(text.encode("utf-8")),
                            "top_logprobs": [{"token": lp.decoded_token or "", "logprob": _finite(lp.logprob),
                                              "bytes": list((lp.decoded_token or "").encode("utf-8"))}
                                             for lp in ranked]})
        return {"content": content}


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file holding a Jinja template, or the template itself."""
    if value is None:
        return None
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    if "{" not in value:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    return value
