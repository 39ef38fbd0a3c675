"""POST /v1/completions: prompts (text or token ids) -> a text_completion body or its SSE chunks."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.engine.request_stream import RequestStream
from tokenmill.request import RequestOutput
from tokenmill.server.deltas import ChoiceDelta, OutputDeltas
from tokenmill.server.echo import EchoPrompt, echo_delta, prompt_logprobs_json, prompt_only
from tokenmill.server.errors import APIError
from tokenmill.server.logprobs import completion_logprobs
from tokenmill.server.protocol import CompletionRequest
from tokenmill.server.serving import OpenAIServing, chunk, continuous_usage, kv_transfer_field, usage
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
        # max_tokens=0 (echo only): one token is generated and dropped, as vLLM
        params = self._sampling_params(req, 1 if req.max_tokens == 0 else req.max_tokens, req.logprobs, aliases,
                                       structured, _prompt_logprobs(req))
        engine_prompts = await self._engine_prompts(prompts)
        echoes = await self._echo_prompts(engine_prompts) if req.echo else None
        base = f"cmpl-{uuid.uuid4().hex}"
        ids = [f"{base}-{i}" for i in range(len(prompts))]
        stream = await self._add(list(zip(ids, engine_prompts, [params] * len(prompts))), arrival, aliases)
        self._remember_ids(raw, ids)
        created = int(time.time())
        if req.stream:
            return EventStream(self._stream(stream, ids, base, created, req, echoes), on_close=stream.abort)
        final = await self._final_outputs(stream, raw)
        if final is None:
            return Response(status_code=499)  # the client is gone: nobody reads this
        outs = [final[i] if req.max_tokens != 0 else prompt_only(final[i]) for i in ids]
        return JSONResponse({"id": base, "object": "text_completion", "created": created, "model": self.model_name,
                             "choices": _choices(outs, req, echoes), "usage": usage(outs),
                             **kv_transfer_field(outs)})

    def _check_request(self, req: CompletionRequest) -> None:
        self._check_model(req.model)
        self._common_checks(req)
        if req.max_tokens is not None and req.max_tokens == 0 and not req.echo:
            raise APIError(400, "max_tokens must be >= 1 (0 only with echo: the prompt alone)", param="max_tokens")
        if req.stream and req.prompt_logprobs is not None:
            raise APIError(400, "prompt_logprobs is not available with stream=true (use echo with logprobs)",
                           param="prompt_logprobs")
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

    async def _echo_prompts(self, engine_prompts: list[dict | list[int]]) -> list[EchoPrompt]:
        """The prompt text to echo (token-id prompts decoded) and the first token's text."""
        out = []
        vocab = self.engine.vocab_size
        for p in engine_prompts:
            ids = p["prompt_token_ids"] if isinstance(p, dict) else p
            if any(not 0 <= t < vocab for t in ids):  # decoded here, before the engine checks them
                raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
            text = p["prompt"] if isinstance(p, dict) else await self.tokenizer.decode(ids)
            out.append(EchoPrompt(text, await self.tokenizer.decode(ids[:1])))
        return out

    async def _stream(self, stream: RequestStream, ids: list[str], base: str, created: int,
                      req: CompletionRequest, echoes: list[EchoPrompt] | None) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = continuous_usage(req)
        deltas = {rid: OutputDeltas() for rid in ids}
        index_of = {rid: p for p, rid in enumerate(ids)}
        offsets: dict[int, int] = {}
        latest: dict[str, RequestOutput] = {}
        head = {"id": base, "object": "text_completion", "created": created, "model": self.model_name}
        try:
            try:
                while not stream.finished:
                    for out in await stream.next_outputs():
                        out = prompt_only(out) if req.max_tokens == 0 else out
                        latest[out.request_id] = out
                        p = index_of[out.request_id]
                        for d in deltas[out.request_id].update(out):
                            echo = echoes[p] if echoes is not None and p * req.n + d.index not in offsets else None
                            generated_ids = d.token_ids
                            if echo is not None:
                                d = echo_delta(d, echo, out)
                            choice = _delta_choice(d, p, req, offsets, echo.first_token_text if echo else "")
                            if choice is not None and req.return_token_ids:
                                choice["token_ids"] = generated_ids
                            if choice is not None:
                                yield chunk(head, [choice], include_usage, [out] if continuous else None)
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


def _prompt_logprobs(req: CompletionRequest) -> int | None:
    """What the engine computes for the prompt: vLLM's prompt_logprobs, and echo's logprobs."""
    asked = [k for k in (req.prompt_logprobs, req.logprobs if req.echo else None) if k is not None]
    return max(asked) if asked else None


def _choices(outs: list[RequestOutput], req: CompletionRequest, echoes: list[EchoPrompt] | None) -> list[dict]:
    choices = []
    for p, out in enumerate(outs):
        for c in out.outputs:
            text, ids, lps, first = c.text, c.token_ids, c.logprobs, ""
            if echoes is not None:
                d = echo_delta(ChoiceDelta(c.index, c.text, c.token_ids, c.logprobs, None, None), echoes[p], out)
                text, ids, lps, first = d.text, d.token_ids, d.logprobs, echoes[p].first_token_text
            choice = {"index": p * req.n + c.index, "text": text,
                      "logprobs": completion_logprobs(lps, ids, req.logprobs, 0, first)
                      if req.logprobs is not None else None,
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
            if req.return_token_ids:
                choice["prompt_token_ids"] = out.prompt_token_ids
                choice["token_ids"] = c.token_ids
            choices.append(choice)
    return choices


def _delta_choice(d: ChoiceDelta, prompt_index: int, req: CompletionRequest, offsets: dict[int, int],
                  unscored_text: str = "") -> dict | None:
    """The streamed choice for one delta, or None when there is nothing to send yet (text held
    back: a partial character or a possible stop string)."""
    if not (d.text or d.finish_reason or req.logprobs is not None or req.return_token_ids):
        return None
    idx = prompt_index * req.n + d.index
    choice = {"index": idx, "text": d.text, "logprobs": None, "finish_reason": d.finish_reason,
              "stop_reason": d.stop_reason}
    offset = offsets.get(idx, 0)
    if req.logprobs is not None and d.logprobs is not None:
        lp = choice["logprobs"] = completion_logprobs(d.logprobs, d.token_ids, req.logprobs, offset, unscored_text)
        # text_offset counts the tokens' own texts, as the whole response's does: the streamed text
        # can lag them (held back while a stop string may still match, or a character is incomplete)
        if lp["tokens"]:
            offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
    offsets[idx] = offset
    if req.return_token_ids:
        choice["token_ids"] = d.token_ids
    return choice
