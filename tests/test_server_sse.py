"""The SSE response over sse-starlette: exact bytes, and the body is closed when the client leaves."""
from __future__ import annotations

import asyncio

from tokenmill.server.sse import DONE, EventStream, sse_json

SAFETY_NET_S = 30.0  # only against a hang
SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}


def _run(stream: EventStream, receive, send) -> None:
    asyncio.run(asyncio.wait_for(stream(SCOPE, receive, send), SAFETY_NET_S))


def test_events_bytes_and_headers():
    sent: list[dict] = []
    closed: list[bool] = []

    async def events():
        yield sse_json({"a": "é", "b": [1, 2]})
        yield DONE

    async def receive():  # the client stays connected
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    _run(EventStream(events(), on_close=lambda: closed.append(True)), receive, send)
    headers = dict(sent[0]["headers"])
    assert headers[b"cache-control"] == b"no-cache" and headers[b"x-accel-buffering"] == b"no"
    assert headers[b"content-type"].startswith(b"text/event-stream")
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert body == 'data: {"a":"é","b":[1,2]}\n\ndata: [DONE]\n\n'.encode()
    assert closed == [True]


def test_disconnect_closes_the_running_body():
    started, finalized, closed = asyncio.Event(), [], []

    async def events():
        try:
            started.set()
            await asyncio.Event().wait()  # waiting for the engine, which never answers
            yield "never"
        finally:
            finalized.append(True)  # the real generators abort their engine requests here

    async def receive():
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    _run(EventStream(events(), on_close=lambda: closed.append(True)), receive, send)
    assert finalized == [True] and closed == [True]


def test_disconnect_before_the_body_starts_still_calls_on_close():
    gone, closed = asyncio.Event(), []

    async def events():
        yield "never"

    async def receive():
        gone.set()
        return {"type": "http.disconnect"}

    async def send(message):
        await gone.wait()  # the client leaves while the response headers go out
        await asyncio.sleep(SAFETY_NET_S)

    _run(EventStream(events(), on_close=lambda: closed.append(True)), receive, send)
    assert closed == [True]
