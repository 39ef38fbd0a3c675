"""Structured outputs and tool calling through the HTTP API with the official `openai` client, on
the real default model (SmolLM2-135M-Instruct; its chat template has no tool support, so the
documented fallback prompt is in use)."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "SmolLM2-135M-Instruct"
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 16}},
                                               "required": ["city"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)


@pytest.fixture(scope="module")
def client(default_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model(client):
    r = client.beta.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}],
                                           response_format=City, max_tokens=80, temperature=0)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and r.choices[0].finish_reason == "stop"
    assert City.model_validate_json(r.choices[0].message.content) == city


def test_completions_constraints_and_json_object(client):
    def complete(**extra):
        return client.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=24, temperature=0,
                                         extra_body=extra).choices[0]
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", complete(guided_regex=r"[0-9]{3}-[0-9]{4}").text)
    assert complete(structured_outputs={"choice": ["red", "green", "blue"]}).text in ("red", "green", "blue")
    # closed (no additional properties): the JSON fits in max_tokens whatever the model's greedy path
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}}, "required": ["colour"],
              "additionalProperties": False}
    c = complete(guided_json=schema)
    jsonschema.validate(json.loads(c.text), schema)
    c = complete(response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    jsonschema.validate(json.loads(c.text), schema)
    c = complete(guided_grammar='root ::= "(" [a-z]+ ")"', max_tokens=6)
    assert c.finish_reason == "length" or re.fullmatch(r"\([a-z]+\)", c.text)


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format", "bogus"),
    ({"guided_regex": "(", "max_tokens": 4}, "guided_regex", "regex"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "tool_choice"),
])
def test_bad_constraints_are_400_naming_the_field(default_server, body, param, words):
    r = httpx.post(default_server.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_tool_calls_round_trip_in_two_turns(client, default_server):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)

    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    rendered = httpx.post(default_server.url + "/tokenize", timeout=60,
                          json={"messages": history, "tools": TOOLS, "return_token_strs": True}).json()
    text = httpx.post(default_server.url + "/detokenize", json={"tokens": rendered["tokens"]}, timeout=60).json()
    assert call.function.arguments in text["prompt"] and '{"temperature": 21}' in text["prompt"]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=24, temperature=0)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    assert second.usage.prompt_tokens < rendered["count"]  # tool_choice "none": the tool listing is left out


@pytest.mark.parametrize("tool_choice, parallel", [
    ("required", True), ({"type": "function", "function": {"name": "get_time"}}, True), ("auto", True)])
def test_streamed_tool_call_deltas_reassemble_to_the_whole_response(client, tool_choice, parallel):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel,
                  max_tokens=48, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    expect = [{"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls or []]
    assert [calls[i] for i in sorted(calls)] == expect
    assert (content or None) == whole.message.content and finish == whole.finish_reason
    if tool_choice != "auto":
        assert expect and all(c["name"] in ("get_weather", "get_time") for c in expect)


def test_tokenize_detokenize(default_server):
    url = default_server.url
    tok = httpx.post(url + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}, timeout=30).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] == 1024
    assert httpx.post(url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json() == {"prompt": "Hello world"}
    bad = httpx.post(url + "/detokenize", json={"tokens": [10**9]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = httpx.post(url + "/tokenize", json={"prompt": "a", "messages": ASK}, timeout=30)
    assert both.status_code == 400
