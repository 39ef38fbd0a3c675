"""POST /v1/completions: prompts (text or token ids) -> a text_completion body or its SSE chunks."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.engine.async_engine import RequestStream
from tokenmill.request import RequestOutput
from tokenmill.server.deltas import ChoiceDelta, OutputDeltas
from tokenmill.server.errors import APIError
from tokenmill.server.logprobs import completion_logprobs
from tokenmill.server.protocol import CompletionRequest
from tokenmill.server.serving import OpenAIServing, chunk, usage
from tokenmill.server.sse import DONE, EventStream, sse_json
from tokenmill.server.structured_outputs import structured_outputs_of

MAX_PROMPTS = 256  # prompts in one completions request

Prompt = str | list[int]


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, req: CompletionRequest, raw: Request | None, arrival: float) -> Response:
        self._check_request(req)
        prompts = _prompts(req.prompt)
        structured, source = structured_outputs_of(req)
        aliases = {"structured_outputs": source} if source else {}
        params = self._sampling_params(req, req.max_tokens, req.logprobs, aliases, structured)
        engine_prompts = await self._engine_prompts(prompts)
        base = f"cmpl-{uuid.uuid4().hex}"
        ids = [f"{base}-{i}" for i in range(len(prompts))]
        stream = await self._add(list(zip(ids, engine_prompts, [params] * len(prompts))), arrival, aliases)
        created = int(time.time())
        if req.stream:
            return EventStream(self._stream(stream, ids, base, created, req), on_close=stream.abort)
        final = await self._final_outputs(stream, raw)
        if final is None:
            return Response(status_code=499)  # the client is gone: nobody reads this
        outs = [final[i] for i in ids]
        return JSONResponse({"id": base, "object": "text_completion", "created": created, "model": self.model_name,
                             "choices": _choices(outs, req), "usage": usage(outs)})

    def _check_request(self, req: CompletionRequest) -> None:
        self._check_model(req.model)
        self._common_checks(req)
        if req.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of must equal n (beam search is not supported)", param="best_of")

    async def _engine_prompts(self, prompts: list[Prompt]) -> list[dict | list[int]]:
        """Text prompts tokenized in the tokenizer pool; the engine gets their ids and keeps the text."""
        texts = [p for p in prompts if isinstance(p, str)]
        if any(not t for t in texts):
            raise APIError(400, "prompt must not be empty", param="prompt")
        encoded = iter(await self.tokenizer.encode(texts) if texts else [])
        return [{"prompt": p, "prompt_token_ids": next(encoded)} if isinstance(p, str) else p for p in prompts]

    async def _stream(self, stream: RequestStream, ids: list[str], base: str, created: int,
                      req: CompletionRequest) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
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
                        for d in deltas[out.request_id].update(out):
                            choice = _delta_choice(d, index_of[out.request_id], req, offsets)
                            if choice is not None:
                                yield chunk(head, [choice], include_usage)
                if include_usage:
                    yield sse_json({**head, "choices": [], "usage": usage([latest[i] for i in ids])})
            except Exception as e:
                yield self._error_event(e)
            yield DONE
        finally:
            stream.abort()


def _prompts(prompt: str | list) -> list[Prompt]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    if len(prompt) > MAX_PROMPTS:
        raise APIError(400, f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}", param="prompt")
    return [p if isinstance(p, str) else list(p) for p in prompt]


def _choices(outs: list[RequestOutput], req: CompletionRequest) -> list[dict]:
    choices = []
    for p, out in enumerate(outs):
        for c in out.outputs:
            choice = {"index": p * req.n + c.index, "text": c.text,
                      "logprobs": completion_logprobs(c.logprobs, c.token_ids, req.logprobs, 0)
                      if req.logprobs is not None else None,
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice["prompt_token_ids"] = out.prompt_token_ids
                choice["token_ids"] = c.token_ids
            choices.append(choice)
    return choices


def _delta_choice(d: ChoiceDelta, prompt_index: int, req: CompletionRequest, offsets: dict[int, int]) -> dict | None:
    """The streamed choice for one delta, or None when there is nothing to send yet (text held
    back: a partial character or a possible stop string)."""
    if not (d.text or d.finish_reason or req.logprobs is not None or req.return_token_ids):
        return None
    idx = prompt_index * req.n + d.index
    choice = {"index": idx, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason,
              "stop_reason": d.stop_reason}
    if req.logprobs is not None and d.logprobs is not None:
        choice["logprobs"] = completion_logprobs(d.logprobs, d.token_ids, req.logprobs, offsets.get(idx, 0))
    offsets[idx] = offsets.get(idx, 0) + len(d.text)
    if req.return_token_ids:
        choice["token_ids"] = d.token_ids
    return choice
