"""The OpenAI API through the official `openai` client (sync and async) against a live tiny server."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from e2e_helpers import TINY_CHAT_TEMPLATE

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over the lazy dog."
CHAT = [{"role": "user", "content": "Hello world, how are you today?"}]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def aclient_url(server) -> str:
    return server.url + "/v1"


def _async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def test_health_models_and_loading_status(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "tiny-alias"]
    assert models["data"][0]["max_model_len"] == 512


def test_completion_usage_and_seeded_stream_equality(client, tiny_tokenizer):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=1234,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    assert full.usage.prompt_tokens == len(tiny_tokenizer.encode(PROMPT))
    assert full.usage.completion_tokens == 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + 12
    assert full.model == MODEL and full.object == "text_completion"

    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_cached_tokens_reported(client):
    prompt = " ".join(["one two three four five six seven eight"] * 6)
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < again.usage.prompt_tokens  # whole blocks of 16 reused


def test_completion_token_ids_n_logprobs_stop(client):
    r = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=5, n=2, temperature=1.0, seed=7,
                                  logprobs=3, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 4
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 10
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(1 <= len(t) <= 4 for t in lp.top_logprobs)
    # several prompts -> one choice each
    r = client.completions.create(model=MODEL, prompt=["Hello world", "Paris is"], max_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1] and r.usage.completion_tokens == 6
    # a stop string that appears in the greedy output cuts it there
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
    stop = greedy[3:5] if len(greedy) >= 5 else None
    if stop and stop.strip():
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "stop" and stop not in r.choices[0].text
        assert greedy.startswith(r.choices[0].text)


def test_chat_sync_stream_equals_non_stream(client, tiny_tokenizer):
    kw = dict(model="tiny-alias", messages=CHAT, max_completion_tokens=10, temperature=0.8, top_p=0.9, seed=99,
              extra_body={"ignore_eos": True, "top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1})
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    assert msg.role == "assistant" and full.choices[0].finish_reason == "length"
    ids = tiny_tokenizer.apply_chat_template(CHAT, chat_template=TINY_CHAT_TEMPLATE, tokenize=True,
                                             add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert full.usage.prompt_tokens == len(ids)
    assert full.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].usage.prompt_tokens == len(ids)


def test_chat_without_max_tokens_fills_the_context(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 512  # max_model_len


def test_chat_logprobs_and_penalties(client):
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, logprobs=True, top_logprobs=2,
                                       presence_penalty=0.5, frequency_penalty=0.5,
                                       extra_body={"ignore_eos": True, "min_tokens": 4})
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_async_client_completions_and_chat(aclient_url):
    async def main():
        client = _async_client(aclient_url)
        try:
            comp, chat = await asyncio.gather(
                client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=3, temperature=1.0,
                                          extra_body={"ignore_eos": True}),
                client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, seed=3,
                                               extra_body={"ignore_eos": True}))
            text = ""
            async for chunk in await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, seed=3,
                                                               temperature=1.0, stream=True,
                                                               extra_body={"ignore_eos": True}):
                text += chunk.choices[0].text
            chat_text = ""
            async for chunk in await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6,
                                                                    seed=3, stream=True,
                                                                    extra_body={"ignore_eos": True}):
                chat_text += chunk.choices[0].delta.content or ""
            return comp, chat, text, chat_text
        finally:
            await client.close()

    comp, chat, text, chat_text = asyncio.run(main())
    assert comp.usage.completion_tokens == 6 and chat.usage.completion_tokens == 6
    assert text == comp.choices[0].text
    assert chat_text == chat.choices[0].message.content


def test_request_id_echoed(server):
    rid = "my request / 42 (not a uuid)"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                   headers={"X-Request-Id": rid})
    assert r.status_code == 200 and r.headers["x-request-id"] == rid
    r = httpx.get(server.url + "/health", headers={"X-Request-Id": "h-1"})
    assert r.headers["x-request-id"] == "h-1"
    bad = httpx.post(server.url + "/v1/completions", content=b"{", headers={"X-Request-Id": "e-1"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "e-1"
    assert httpx.get(server.url + "/health").headers["x-request-id"]  # made up when absent


def test_raw_sse_format(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"messages": CHAT, "max_tokens": 3, "stream": True, "n": 2,
                            "stream_options": {"include_usage": True}, "ignore_eos": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    bodies = [json.loads(e[6:]) for e in events[:-1]]
    assert {b["object"] for b in bodies} == {"chat.completion.chunk"}
    finished = sorted(c["index"] for b in bodies for c in b["choices"] if c.get("finish_reason"))
    assert finished == [0, 1]
    assert bodies[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_max_tokens_beyond_the_context_is_a_400(client, endpoint):
    """As the OpenAI API and vLLM: never generate past (or silently clamp to) the context."""
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "completions":
            client.completions.create(model="tiny", prompt="hi", max_tokens=100_000)
        else:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_completion_tokens=100_000)
    err = e.value.body
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == ("max_tokens" if endpoint == "completions" else "max_completion_tokens")
    assert "maximum context length is 512 tokens" in err["message"] and "you requested" in err["message"]


def test_models_retrieve_version_and_ping(server, client):
    assert client.models.retrieve("tiny-alias").id == "tiny-alias"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    assert httpx.get(server.url + "/version").json()["version"]
    assert httpx.get(server.url + "/ping").status_code == 200 and httpx.post(server.url + "/ping").status_code == 200


def test_explicit_nulls_mean_the_defaults(server):
    """Clients that serialise unset fields as null (OpenAI marks them nullable; vLLM's are Optional)."""
    nulls = {"n": None, "stream": None, "stream_options": None, "min_tokens": None, "ignore_eos": None,
             "skip_special_tokens": None, "temperature": None, "max_tokens": 3}
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": CHAT, "logprobs": None, "parallel_tool_calls": None, **nulls})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["choices"][0]["logprobs"] is None
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "echo": None, **nulls})
    assert r.status_code == 200 and not r.json()["choices"][0]["text"].startswith(PROMPT)


def test_stream_options_need_stream_and_an_empty_schema_is_any_json(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2,
                                                         "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    fmt = {"type": "json_schema", "json_schema": {"name": "any", "schema": {}}}
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 40,
                                                              "response_format": fmt})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        json.loads(choice["message"]["content"])


def test_logit_bias_through_the_api(client, server):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={"77": 100},
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.model_dump()["choices"][0]["token_ids"] == [77] * 4
    for bias in ({"x": 1}, {"77": 500}, {"999999": 1}):
        e = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "logit_bias": bias}).json()["error"]
        assert e["param"] == "logit_bias", e
    # vLLM's bad_words and allowed_token_ids reach the sampler too
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                     extra_body={"ignore_eos": True, "return_token_ids": True})
    first = free.model_dump()["choices"][0]["token_ids"][0]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, extra_body={
        "ignore_eos": True, "return_token_ids": True, "allowed_token_ids": [first, 77]})
    assert set(r.model_dump()["choices"][0]["token_ids"]) <= {first, 77}
    e = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "bad_words": [""]}).json()["error"]
    assert e["param"] == "bad_words", e


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_continuous_usage_stats(client, endpoint):
    """stream_options.continuous_usage_stats: every chunk carries the counts so far (vLLM's)."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    kw = dict(model=MODEL, max_tokens=6, temperature=0, stream=True, extra_body={"ignore_eos": True,
                                                                                  "stream_options": opts})
    if endpoint == "completions":
        chunks = list(client.completions.create(prompt=PROMPT, **kw))
    else:
        chunks = list(client.chat.completions.create(messages=CHAT, **kw))
    final = chunks[-1].usage
    assert final.completion_tokens == 6 and not chunks[-1].choices
    counted = [c.usage for c in chunks[:-1] if c.usage is not None]
    assert counted and all(u.prompt_tokens == final.prompt_tokens for u in counted)
    steps = [u.completion_tokens for u in counted]
    assert steps == sorted(steps) and steps[-1] == 6 and all(u.total_tokens == u.prompt_tokens + u.completion_tokens
                                                             for u in counted)
