"""200 concurrent requests, chat and completions with text prompts, streaming and not, through the
`openai` client: the server tokenizes them in its own threads while the engine thread decodes, so a
shared tokenizer would fail here ("Already borrowed" -> 500)."""
from __future__ import annotations

import asyncio

import openai
from e2e_helpers import TINY_CHAT_TEMPLATE

NUM_REQUESTS = 200
MAX_TOKENS = 3
EXTRA = {"ignore_eos": True}


def _text(i: int) -> str:
    return " ".join(["Hello world, how are you"] * (1 + i % 5)) + f" number {i}?"


async def _completion(client: openai.AsyncOpenAI, i: int, stream: bool) -> tuple[str, int, int]:
    kw = dict(model="tiny", prompt=_text(i), max_tokens=MAX_TOKENS, extra_body=EXTRA)
    if not stream:
        r = await client.completions.create(**kw)
        assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
        return r.choices[0].text, r.usage.prompt_tokens, r.usage.completion_tokens
    chunks = [c async for c in await client.completions.create(**kw, stream=True,
                                                                 stream_options={"include_usage": True})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1].usage
    return "".join(c.choices[0].text for c in chunks if c.choices), usage.prompt_tokens, usage.completion_tokens


async def _chat(client: openai.AsyncOpenAI, i: int, stream: bool) -> tuple[str, int, int]:
    kw = dict(model="tiny", messages=[{"role": "user", "content": _text(i)}], max_tokens=MAX_TOKENS,
              extra_body=EXTRA)
    if not stream:
        r = await client.chat.completions.create(**kw)
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.choices[0].finish_reason == "length"
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens
    chunks = [c async for c in await client.chat.completions.create(**kw, stream=True,
                                                                      stream_options={"include_usage": True})]
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    return ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), usage.prompt_tokens,
            usage.completion_tokens)


def test_200_concurrent_mixed_requests(server, tiny_tokenizer):
    async def one(client: openai.AsyncOpenAI, i: int):
        kind, stream = ("chat" if i % 2 else "completion"), i % 4 >= 2
        try:
            return await (_chat if kind == "chat" else _completion)(client, i, stream)
        except openai.APIStatusError as e:
            return e.status_code

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(NUM_REQUESTS)))
        finally:
            await client.close()

    results = asyncio.run(main())
    failed = {i: r for i, r in enumerate(results) if not isinstance(r, tuple)}
    assert not failed, failed
    for i, (text, prompt_tokens, completion_tokens) in enumerate(results):
        assert isinstance(text, str) and completion_tokens == MAX_TOKENS, (i, results[i])
        if i % 2:
            ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": _text(i)}],
                                                     chat_template=TINY_CHAT_TEMPLATE, tokenize=True,
                                                     add_generation_prompt=True)
            expected = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            expected = len(tiny_tokenizer.encode(_text(i)))
        assert prompt_tokens == expected, (i, prompt_tokens, expected)
