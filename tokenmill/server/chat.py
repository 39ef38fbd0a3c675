"""POST /v1/chat/completions: messages -> chat template -> a chat.completion body or its SSE chunks."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.engine.request_stream import RequestStream
from tokenmill.request import RequestOutput
from tokenmill.server.deltas import ChoiceDelta, OutputDeltas
from tokenmill.server.chat_tools import ChatTools, ToolDeltas
from tokenmill.server.echo import prompt_logprobs_json
from tokenmill.server.errors import APIError
from tokenmill.server.logprobs import chat_logprobs
from tokenmill.server.protocol import ChatCompletionRequest, ChatMessage
from tokenmill.server.serving import OpenAIServing, chunk, continuous_usage, kv_transfer_field, usage
from tokenmill.server.sse import DONE, EventStream, sse_json
from tokenmill.server.structured_outputs import structured_outputs_of
from tokenmill.engine.chat_template import PromptError, join_text_parts


class OpenAIServingChat(OpenAIServing):
    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request | None,
                                     arrival: float) -> Response:
        self._check_request(req)
        tools = ChatTools.of(req)
        max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        aliases = {"logprobs": "top_logprobs", "prompt": "messages", "max_tokens": max_param}
        structured, source = structured_outputs_of(req)
        if tools.choice.constrained:
            if structured is not None:
                raise APIError(400, f"{source} cannot be combined with tool_choice {req.tool_choice!r}", param=source)
            structured, source = tools.constraint(), "tools"
        if source:
            aliases["structured_outputs"] = source
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        # max_tokens None: the engine gives the request all the room left in the context
        params = self._sampling_params(req, max_tokens, logprobs, aliases, structured, req.prompt_logprobs)
        prompt_ids = await self._prompt_ids(req, tools.prompt_tools)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await self._add([(rid, {"prompt_token_ids": prompt_ids}, params)], arrival, aliases)
        self._remember_ids(raw, [rid])
        created = int(time.time())
        if req.stream:
            return EventStream(self._stream(stream, rid, created, req, tools), on_close=stream.abort)
        final = await self._final_outputs(stream, raw)
        if final is None:
            return Response(status_code=499)  # the client is gone: nobody reads this
        return JSONResponse(self._response(final[rid], rid, created, req, tools))

    def _check_request(self, req: ChatCompletionRequest) -> None:
        self._check_model(req.model)
        self._common_checks(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs is not available with stream=true", param="prompt_logprobs")

    async def _prompt_ids(self, req: ChatCompletionRequest, tools: list[dict] | None) -> list[int]:
        kwargs = dict(req.chat_template_kwargs or {})
        if req.continue_final_message:
            kwargs["continue_final_message"] = True
        add_generation_prompt = req.add_generation_prompt and not req.continue_final_message
        try:
            return await self.tokenizer.chat_prompt(template_messages(req.messages), add_generation_prompt, kwargs, tools)
        except PromptError as e:
            raise APIError(400, str(e), param="messages") from None

    def _response(self, out: RequestOutput, rid: str, created: int, req: ChatCompletionRequest,
                  tools: ChatTools) -> dict:
        choices = []
        for c in out.outputs:
            message, finish_reason = tools.message(c.text, c.finish_reason)
            choice = {"index": c.index, "message": message,
                      "logprobs": chat_logprobs(c.logprobs, c.token_ids, req.top_logprobs or 0)
                      if req.logprobs else None,
                      "finish_reason": finish_reason, "stop_reason": c.stop_reason}
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        body = {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                "choices": choices, "usage": usage([out]), **kv_transfer_field([out])}
        if req.return_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return body

    async def _stream(self, stream: RequestStream, rid: str, created: int,
                      req: ChatCompletionRequest, tools: ChatTools) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = continuous_usage(req)
        deltas = OutputDeltas()
        tool_deltas = {i: ToolDeltas(tools) for i in range(req.n)} if tools.active else None
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
                            choices = ([_delta_choice(d, req)] if tool_deltas is None
                                       else _tool_delta_choices(d, req, tool_deltas[d.index]))
                            for choice in choices:
                                if choice is not None:
                                    yield chunk(head, [choice], include_usage, [out] if continuous else None)
                if include_usage and latest is not None:
                    yield sse_json({**head, "choices": [], "usage": usage([latest])})
            except Exception as e:
                yield self._error_event(e)
            yield DONE
        finally:
            stream.abort()


def template_messages(chat: list[ChatMessage]) -> list[dict]:
    """The messages as the chat template takes them (text parts joined into one string)."""
    try:
        return join_text_parts([m.model_dump(exclude_none=True) for m in chat])
    except PromptError as e:
        raise APIError(400, str(e), param="messages") from None


def _tool_delta_choices(d: ChoiceDelta, req: ChatCompletionRequest, tools: ToolDeltas) -> list[dict]:
    """With tools, content and tool_calls deltas come from the tool-call parser; the last chunk
    carries the finish reason (and this delta's logprobs / token ids, if asked)."""
    parts, finish_reason = tools.update(d.text, d.finish_reason)
    choices = [{"index": d.index, "delta": p, "logprobs": None, "finish_reason": None} for p in parts]
    last = _delta_choice(ChoiceDelta(d.index, "", d.token_ids, d.logprobs, finish_reason, d.stop_reason), req)
    return choices + ([last] if last is not None else [])


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
