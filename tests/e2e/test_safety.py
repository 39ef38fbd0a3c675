"""Errors, limits, disconnects, load and /metrics against live tiny servers."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

CHAT = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": "Bearer sekret"}


def _assert_error(r: httpx.Response, status: int, param=None, code=None, type_=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] is None or isinstance(err["code"], str), err  # a string, as OpenAI sends
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if type_ is not None:
        assert err["type"] == type_, err
    return err


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/completions", b'{"prompt": "hi",', 400, None),                       # malformed JSON
    ("/v1/completions", b'[1, 2]', 400, None),                                 # not an object
    ("/v1/completions", b'{"max_tokens": 3}', 400, "prompt"),                  # missing field
    ("/v1/completions", b'{"prompt": "hi", "temperature": "hot"}', 400, "temperature"),  # wrong type
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": "3"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": [1, true]}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": 1000}', 400, "temperature"),  # out of range
    ("/v1/completions", b'{"prompt": "hi", "top_p": 0}', 400, "top_p"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "n": 0}', 400, "n"),
    ("/v1/completions", b'{"prompt": "hi", "logprobs": 21}', 400, "logprobs"),
    ("/v1/completions", b'{"prompt": "hi", "min_tokens": 5, "max_tokens": 2}', 400, "min_tokens"),
    ("/v1/completions", b'{"prompt": "hi", "presence_penalty": 3}', 400, "presence_penalty"),
    ("/v1/completions", b'{"prompt": "hi", "seed": 99999999999999999999}', 400, "seed"),
    ("/v1/completions", b'{"prompt": "hi", "stop_token_ids": [100000]}', 400, "stop_token_ids"),  # engine's check
    ("/v1/completions", b'{"prompt": "hi", "seed": -9223372036854775809}', 400, "seed"),  # SamplingParams' check
    ("/v1/completions", b'{"prompt": "hi", "n": 2.0}', 400, "n"),
    ("/v1/completions", b'{"prompt": [1, 2, 99999]}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": [-1], "echo": true}', 400, "prompt"),  # found by schemathesis: a 500
    ("/v1/completions", b'{"prompt": ""}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stream": true, "top_k": -5}', 400, "top_k"),  # streaming too
    ("/v1/completions", json.dumps({"prompt": "hi", "stop": [f"s{i}" for i in range(65)]}).encode(), 400,
     "stop"),  # each stop string costs every token of the step: capped
    ("/v1/completions", json.dumps({"prompt": "hi", "stop_token_ids": [5] * 257}).encode(), 400, "stop_token_ids"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    # found by schemathesis: a non-list tool_calls reached the tool fallback (TypeError -> 500)
    ("/v1/chat/completions", b'{"messages": [{"role": "", "tool_calls": true}]}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}', 400,
     "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, '
                             b'"top_logprobs": 50}', 400, "top_logprobs"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}',
     400, "max_completion_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stop_token_ids": [-1], '
                             b'"stream": true}', 400, "stop_token_ids"),
])
def test_bad_requests_are_400(server, path, body, status, param):
    r = httpx.post(server.url + path, content=body, headers={"Content-Type": "application/json"})
    _assert_error(r, status, param, type_="invalid_request_error")


def test_messages_name_the_field_the_request_used(server):
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "max_completion_tokens": -5})
    assert r.json()["error"]["message"].startswith("max_completion_tokens must be")
    r = httpx.post(server.url + "/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 25})
    assert r.json()["error"]["message"].startswith("top_logprobs must be")


def test_prompt_over_context_unknown_model_and_routes(server):
    long_prompt = "one two three four five six seven eight " * 80  # > 512 tokens
    _assert_error(httpx.post(server.url + "/v1/completions", json={"prompt": long_prompt}), 400, "prompt")
    _assert_error(httpx.post(server.url + "/v1/completions", json={"prompt": list(range(1, 513)),
                                                                   "stream": True}), 400, "prompt")
    long_chat = [{"role": "user", "content": long_prompt}]
    _assert_error(httpx.post(server.url + "/v1/chat/completions", json={"messages": long_chat}), 400, "messages")
    _assert_error(httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "model": "gpt-9"}), 404, "model",
                  "model_not_found")
    _assert_error(httpx.post(server.url + "/v1/chat/completions", json={"messages": CHAT, "model": "x",
                                                                        "stream": True}), 404, "model")
    _assert_error(httpx.get(server.url + "/v1/nowhere"), 404, code="not_found", type_="not_found_error")
    _assert_error(httpx.get(server.url + "/v1/completions"), 405, code="method_not_allowed")
    # and the engine keeps serving
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(server.url + "/health").status_code == 200


def test_api_key_and_body_cap(strict_server):
    url = strict_server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=headers)
        _assert_error(r, 401, code="invalid_api_key")
        assert r.headers["www-authenticate"] == "Bearer"
    _assert_error(httpx.get(url + "/v1/models"), 401)
    assert httpx.get(url + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(url + "/health").status_code == 200  # health and metrics stay open
    assert httpx.get(url + "/metrics").status_code == 200
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=AUTH)
    assert r.status_code == 200
    big = {"prompt": "x" * 5000}
    _assert_error(httpx.post(url + "/v1/completions", json=big, headers=AUTH), 413, code="request_too_large")

    def chunked():
        yield json.dumps(big).encode()
    _assert_error(httpx.post(url + "/v1/completions", content=chunked(), headers=AUTH), 413)
    # headers past the default 16 KiB cap: our 431 with an OpenAI body, not h11's plain 400
    r = httpx.get(url + "/v1/models", headers={**AUTH, "X-Filler": "f" * 20000})
    _assert_error(r, 431, code="request_header_fields_too_large")


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll until `check()` holds; the timeout is only a safety net against a hang."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _idle(url: str) -> bool:
    m = _metrics(url)
    return (m["tokenmill:kv_cache_usage_perc"] == 0 and m["tokenmill:num_requests_running"] == 0
            and m["tokenmill:num_requests_waiting"] == 0)


LONG = {"prompt": "hello", "max_tokens": 400, "ignore_eos": True}  # >= 20 s on the slow-step server


def test_queue_overflow_is_429(strict_server):
    """--max-num-seqs 1 --max-waiting-requests 2: while a long request runs, of 8 simultaneous
    requests two are admitted to wait and six get 429 with Retry-After, and so does a ninth whose
    body is not even JSON (shed before its body is read); once the long one is aborted, the
    admitted ones complete."""
    _wait_for("the engine to go idle", lambda: _idle(strict_server.url))

    async def main():
        first_token = asyncio.Event()

        async def hold_the_slot(client: httpx.AsyncClient) -> None:
            # reads the long request's stream until cancelled: a `break` out of `aiter_lines()` would
            # leave the generator to be collected, which closes the stream and aborts the request at
            # once (the admitted two then ran, and the queue had room again: a flaky 400 for the ninth)
            async with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        first_token.set()  # a token came out: the blocker holds the only running slot

        async with httpx.AsyncClient(base_url=strict_server.url, headers=AUTH, timeout=120) as c, \
                httpx.AsyncClient(base_url=strict_server.url, headers=AUTH, timeout=120) as blocker_client:
            blocker = asyncio.ensure_future(hold_the_slot(blocker_client))
            await asyncio.wait_for(first_token.wait(), 60)
            tasks = [asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 20,
                                                                            "ignore_eos": True}))
                     for _ in range(8)]

            async def answered(n: int) -> None:
                while sum(t.done() for t in tasks) < n:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(answered(6), 60)  # the timeout is only a safety net
            refused = [t.result() for t in tasks if t.done()]
            # the queue is full: shed before the body is read (not even parsed: a broken one gets 429 too)
            refused.append(await c.post("/v1/completions", content=b"{not json",
                                        headers={"content-type": "application/json"}))
            assert not blocker.done()  # still running (it needs >= 20 s): the two admitted still wait
            blocker.cancel()  # its stream closes: it is aborted and the admitted two run
            with contextlib.suppress(asyncio.CancelledError):
                await blocker
            admitted = await asyncio.gather(*(t for t in tasks if not t.done()))
            return refused, admitted

    refused, admitted = asyncio.run(main())
    assert len(refused) == 7 and len(admitted) == 2
    for r in refused:
        _assert_error(r, 429, code="rate_limit_exceeded")
        assert int(r.headers["retry-after"]) >= 1
    for r in admitted:
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
    _wait_for("the engine to go idle", lambda: _idle(strict_server.url))


def test_disconnect_mid_stream_frees_blocks(strict_server):
    url = strict_server.url
    with httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            while got < 3:
                if next(lines).startswith("data: {"):
                    got += 1
            during = _metrics(url)
            assert during["tokenmill:kv_cache_usage_perc"] > 0
            assert during["tokenmill:num_requests_running"] == 1
        # the response is closed here: the server must abort the request and free its blocks
        _wait_for("the streamed request to be aborted", lambda: _idle(url))
    # a non-streaming client that gives up is aborted too: close the socket while it runs
    body = json.dumps(LONG).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {AUTH['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", strict_server.port)) as sock:
        sock.sendall(head + body)
        _wait_for("the request to run", lambda: _metrics(url)["tokenmill:num_requests_running"] == 1)
    _wait_for("the non-streaming request to be aborted", lambda: _idle(url))


def test_100_concurrent_streams_complete(server):
    async def one(c: httpx.AsyncClient, i: int) -> tuple[int, str | None, int]:
        body = {"prompt": f"Hello world {i}", "max_tokens": 6, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        finish, usage, done = None, None, False
        async with c.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                for ch in chunk["choices"]:
                    finish = ch["finish_reason"] or finish
                if chunk.get("usage"):
                    usage = chunk["usage"]["completion_tokens"]
        return r.status_code, finish if done else None, usage

    async def main():
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            return await asyncio.gather(*[one(c, i) for i in range(100)])

    results = asyncio.run(main())
    assert results == [(200, "length", 6)] * 100
    assert httpx.get(server.url + "/health").status_code == 200


METRIC_NAMES = [
    "tokenmill:time_to_first_token_seconds", "tokenmill:time_per_output_token_seconds",
    "tokenmill:inter_token_latency_seconds", "tokenmill:e2e_request_latency_seconds",
    "tokenmill:request_queue_time_seconds", "tokenmill:num_requests_running", "tokenmill:num_requests_waiting",
    "tokenmill:kv_cache_usage_perc", "tokenmill:kv_block_fill_ratio", "tokenmill:prefix_cache_queries",
    "tokenmill:prefix_cache_hits", "tokenmill:num_preemptions", "tokenmill:prompt_tokens",
    "tokenmill:generation_tokens", "tokenmill:request_success", "tokenmill:cost_per_million_output_tokens_usd",
    "tokenmill:price_per_hour_usd"]


def test_metrics_exposition(server):
    httpx.post(server.url + "/v1/completions", json={"prompt": "Paris is", "max_tokens": 4, "ignore_eos": True})
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    missing = [n for n in METRIC_NAMES if n not in families]
    assert not missing, missing
    samples = {s.name: s for f in families.values() for s in f.samples}
    assert families["tokenmill:time_to_first_token_seconds"].type == "histogram"
    assert families["tokenmill:prefix_cache_hits"].type == "counter"
    assert "tokenmill:prefix_cache_hits_total" in samples and "tokenmill:request_success_total" in samples
    assert samples["tokenmill:time_to_first_token_seconds_count"].value >= 1
    assert samples["tokenmill:generation_tokens_total"].value >= 4
    assert samples["tokenmill:price_per_hour_usd"].value == 1.0
    cost = samples["tokenmill:cost_per_million_output_tokens_usd"].value
    assert 0 < cost < float("inf")  # finite once tokens were generated (NaN before)
    reasons = {s.labels["finished_reason"] for s in families["tokenmill:request_success"].samples
               if s.name.endswith("_total") and s.value > 0}
    assert "length" in reasons
    assert all(s.labels.get("model_name") == "tiny" for f in families.values() for s in f.samples
               if f.name.startswith("tokenmill:"))
    assert not re.search(r"_created", r.text)
