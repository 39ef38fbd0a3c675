"""Server-sent events for the streaming endpoints, on sse-starlette's `EventSourceResponse`.

Each event is `data: <json>\\n\\n` and a stream ends with `data: [DONE]\\n\\n`, as OpenAI sends
them. On a client disconnect sse-starlette cancels the task that iterates the body, which runs the
generator's `finally` (aborting its engine requests) at once; `on_close` also runs whatever
happens, so requests are aborted even when the body was never started.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette.sse import AppStatus, EventSourceResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "[DONE]"

# sse-starlette cancels every open stream as soon as uvicorn begins to shut down. The server
# drains on SIGTERM itself (in-flight requests may finish, the rest end with an error event), so
# that must not happen.
AppStatus.disable_automatic_graceful_drain()


# JSON leaves these unescaped, and clients that split lines as `str.splitlines` does (httpx's
# `iter_lines`, so many hand-written ones) cut an event at them; escaped, they decode the same
_LINE_BREAKERS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse_json(obj: Any) -> str:
    """The data of one event: compact JSON on one line, for every line splitter (no newline, no
    U+0085 / U+2028 / U+2029; tokenmill/sse_reader.py reads such streams)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.translate(_LINE_BREAKERS) if any(c in text for c in "\u0085\u2028\u2029") else text


class EventStream(EventSourceResponse):
    """An OpenAI-style event stream over `events` (each item is the data of one event)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        # ping=0: no keep-alive comment lines; every event is data, as OpenAI clients expect
        super().__init__(events, headers=SSE_HEADERS, ping=0, sep="\n")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
