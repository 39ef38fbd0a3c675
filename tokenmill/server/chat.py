"""POST /v1/chat/completions: messages -> chat template -> a chat.completion body or its SSE chunks."""
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
from tokenmill.server.logprobs import chat_logprobs
from tokenmill.server.protocol import ChatCompletionRequest
from tokenmill.server.serving import OpenAIServing, chunk, usage
from tokenmill.server.sse import DONE, EventStream, sse_json
from tokenmill.server.tokenization import PromptError


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request | None,
                                     arrival: float) -> Response:
        self._check_request(req)
        max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        aliases = {"logprobs": "top_logprobs", "prompt": "messages", "max_tokens": max_param}
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        # max_tokens None: the engine gives the request all the room left in the context
        params = self._sampling_params(req, max_tokens, logprobs, aliases)
        prompt_ids = await self._prompt_ids(req)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await self._add([(rid, {"prompt_token_ids": prompt_ids}, params)], arrival, aliases)
        created = int(time.time())
        if req.stream:
            return EventStream(self._stream(stream, rid, created, req), on_close=stream.abort)
        final = await self._final_outputs(stream, raw)
        if final is None:
            return Response(status_code=499)  # the client is gone: nobody reads this
        return JSONResponse(self._response(final[rid], rid, created, req))

    def _check_request(self, req: ChatCompletionRequest) -> None:
        self._check_model(req.model)
        self._common_checks(req)
        if req.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format {\"type\": \"text\"} is supported", param="response_format")
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")

    async def _prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        kwargs = dict(req.chat_template_kwargs or {})
        if req.continue_final_message:
            kwargs["continue_final_message"] = True
        add_generation_prompt = req.add_generation_prompt and not req.continue_final_message
        try:
            return await self.tokenizer.chat_prompt(_messages(req), add_generation_prompt, kwargs)
        except PromptError as e:
            raise APIError(400, str(e), param="messages") from None

    def _response(self, out: RequestOutput, rid: str, created: int, req: ChatCompletionRequest) -> dict:
        choices = []
        for c in out.outputs:
            choice = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                      "logprobs": chat_logprobs(c.logprobs, c.token_ids, req.top_logprobs or 0)
                      if req.logprobs else None,
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        body = {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": usage([out])}
        if req.return_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        return body

    async def _stream(self, stream: RequestStream, rid: str, created: int,
                      req: ChatCompletionRequest) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        deltas = OutputDeltas()
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        latest: RequestOutput | None = None
        try:
            try:
                for i in range(req.n):  # a role-only first chunk per choice, as OpenAI sends
                    yield chunk(head, [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                        "finish_reason": None}], include_usage)
                while not stream.finished:
                    for out in await stream.next_outputs():
                        latest = out
                        for d in deltas.update(out):
                            choice = _delta_choice(d, req)
                            if choice is not None:
                                yield chunk(head, [choice], include_usage)
                if include_usage and latest is not None:
                    yield sse_json({**head, "choices": [], "usage": usage([latest])})
            except Exception as e:
                yield self._error_event(e)
            yield DONE
        finally:
            stream.abort()


def _messages(req: ChatCompletionRequest) -> list[dict]:
    """The messages as the chat template takes them (text parts joined into one string)."""
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
    return messages


def _delta_choice(d: ChoiceDelta, req: ChatCompletionRequest) -> dict | None:
    """The streamed choice for one delta, or None when there is nothing to send yet (text held
    back: a partial character or a possible stop string)."""
    if not (d.text or d.finish_reason or req.logprobs or req.return_token_ids):
        return None
    choice = {"index": d.index, "delta": {"content": d.text} if d.text else {}, "logprobs": None,
              "finish_reason": d.finish_reason, "stop_reason": d.stop_reason}
    if req.logprobs and d.logprobs is not None:
        choice["logprobs"] = chat_logprobs(d.logprobs, d.token_ids, req.top_logprobs or 0)
    if req.return_token_ids:
        choice["token_ids"] = d.token_ids
    return choice
