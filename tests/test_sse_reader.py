"""Event-stream lines are split at CRLF, LF and CR only (tokenmill/sse_reader.py), wherever the
network cuts the stream; an event whose text holds U+2028, U+2029 or U+0085 reaches the benchmark
client and passes the fleet router whole; our server escapes those three (server/sse.py)."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.bench.client import EndpointConfig, RequestResult, stream_request
from tokenmill.bench.workloads import BenchRequest
from tokenmill.fleet.proxy import forward
from tokenmill.server.sse import sse_json
from tokenmill.sse_reader import LineSplitter, sse_lines

BREAKERS = "\u2028\u2029\u0085\x0b\x1c"  # str.splitlines cuts at these; SSE does not


def spec_lines(text: str) -> list[str]:
    """The SSE spec's split, written out char by char: CRLF, LF or CR end a line; a last line
    without an end still counts."""
    lines, line, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c in "\r\n":
            lines.append("".join(line))
            line = []
            i += 2 if text[i:i + 2] == "\r\n" else 1
            continue
        line.append(c)
        i += 1
    if line:
        lines.append("".join(line))
    return lines


def pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:]) if b > a]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab\r\n é" + BREAKERS, max_size=40), st.lists(st.integers(0, 40), max_size=8))
def test_any_cut_gives_the_spec_lines(text, cuts):
    splitter = LineSplitter()
    got = [line for piece in pieces(text, cuts) for line in splitter.feed(piece)] + splitter.flush()
    assert got == spec_lines(text)


def _events(*payloads: dict) -> str:
    # raw JSON, as a server that does not escape U+2028 sends it
    return "".join(f"data: {json.dumps(p, ensure_ascii=False)}\n\n" for p in payloads) + "data: [DONE]\n\n"


def _chunk(text: str) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}


USAGE = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
BODY = _events(_chunk("one\u2028two"), _chunk("three\u0085four\u2029"), USAGE)


def _upstream(body: str) -> httpx.AsyncClient:
    """A client whose server sends `body` in pieces cut right after each U+2028 / U+0085."""
    async def stream():
        start = 0
        for i, c in enumerate(body):
            if c in "\u2028\u0085":
                yield body[start:i + 1].encode()
                start = i + 1
        yield body[start:].encode()

    return httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())))


def test_sse_lines_of_a_response_keep_each_event_whole():
    async def main():
        async with _upstream(BODY) as client, client.stream("POST", "http://replica/v1/completions") as resp:
            return [line async for line in sse_lines(resp)]
    lines = asyncio.run(main())
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert [c["choices"][0]["text"] for c in data[:2]] == ["one\u2028two", "three\u0085four\u2029"]
    assert [line for line in lines if line][-1] == "data: [DONE]" and lines[-1] == ""


def test_the_benchmark_client_reads_such_a_stream():
    """The chat benchmark lost a request this way (2026-12-02: 'bad SSE payload')."""
    async def main():
        result = RequestResult(index=0, input_len=3, max_tokens=2, scheduled_s=0.0)
        async with _upstream(BODY) as client:
            await stream_request(client, EndpointConfig("http://replica", "m"), BenchRequest("hi", 3, 2), result, 0.0)
        return result
    result = asyncio.run(main())
    assert result.success, result.error
    assert (result.num_chunks, result.output_tokens, result.prompt_tokens) == (2, 2, 3)


def test_the_fleet_router_passes_such_a_stream_on_line_for_line():
    done = []

    async def on_done(usage, status, seconds):
        done.append((usage.completion_tokens, status))

    lease = SimpleNamespace(replica=SimpleNamespace(url="http://replica", name="r0"), pool=SimpleNamespace(name="p"),
                            decision=SimpleNamespace(reason=SimpleNamespace(value="only")))

    async def main():
        async with _upstream(BODY) as client:
            resp = await forward(client, lease, "/v1/completions", {"stream": True, "prompt": "hi"}, {}, on_done)
            return "".join([piece async for piece in resp.body_iterator])
    sent = asyncio.run(main())
    # the client did not ask for usage: the usage event is dropped, every other line is as the replica sent it
    want = _events(_chunk("one\u2028two"), _chunk("three\u0085four\u2029"))
    assert [line for line in spec_lines(sent) if line] == [line for line in spec_lines(want) if line]
    assert done == [(2, "ok")]


def test_our_events_escape_what_line_splitters_cut_at():
    obj = {"text": "a\u2028b\u2029c\u0085d é 中 \x0b"}
    data = sse_json(obj)
    assert json.loads(data) == obj
    assert len(data.splitlines()) == 1 and not set(data) & set(BREAKERS)
    assert "é 中" in data  # everything else stays unescaped UTF-8


def test_the_fleet_router_asks_for_running_counts_only_for_a_client_that_wants_usage():
    """The router always asks its replica for usage (the ledger bills it); running counts in every
    chunk (continuous_usage_stats) only reach a client that asked for usage itself."""
    sent_up = []

    def replica(request):
        sent_up.append(json.loads(request.content)["stream_options"])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=BODY.encode())

    lease = SimpleNamespace(replica=SimpleNamespace(url="http://replica", name="r0"), pool=SimpleNamespace(name="p"),
                            decision=SimpleNamespace(reason=SimpleNamespace(value="only")))

    async def on_done(usage, status, seconds):
        pass

    async def main(options):
        async with httpx.AsyncClient(transport=httpx.MockTransport(replica)) as client:
            resp = await forward(client, lease, "/v1/completions", {"stream": True, "prompt": "hi",
                                                                     "stream_options": options}, {}, on_done)
            return "".join([piece async for piece in resp.body_iterator])
    asyncio.run(main({"continuous_usage_stats": True}))
    asyncio.run(main({"continuous_usage_stats": True, "include_usage": True}))
    assert sent_up == [{"include_usage": True}, {"continuous_usage_stats": True, "include_usage": True}]
