"""A small fake OpenAI-compatible streaming server for the benchmark tests.

It streams ceil(max_tokens / 2) text chunks (two "tokens" each) after a 20 ms "prefill", 5 ms
apart, then a usage chunk reporting exactly max_tokens completion tokens. It fails the requests
whose arrival numbers are in `fail_on` with HTTP 500, and exports tokenmill Prometheus metrics
(10 ms queue time per request, prefix-cache hits = half the queried prompt tokens) but no
`tokenmill:price_per_hour_usd`, so it stands for a server whose price the harness cannot know.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

PREFILL_S = 0.020
CHUNK_GAP_S = 0.005
QUEUE_S = 0.010


@dataclass
class FakeState:
    fail_on: set[int] = field(default_factory=set)
    count: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # of the POSTs, in arrival order
    chunk_gap_s: float = CHUNK_GAP_S

    def reset(self) -> None:
        self.fail_on, self.count, self.bodies, self.paths = set(), 0, [], []
        self.chunk_gap_s = CHUNK_GAP_S


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def make_app(state: FakeState) -> FastAPI:
    app = FastAPI()
    reg = CollectorRegistry()
    queue = Histogram("tokenmill:request_queue_time_seconds", "queue time", registry=reg)
    queries = Counter("tokenmill:prefix_cache_queries", "prefix cache queried tokens", registry=reg)
    hits = Counter("tokenmill:prefix_cache_hits", "prefix cache hit tokens", registry=reg)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(reg).decode())

    async def stream(body: dict, chat: bool) -> AsyncIterator[str]:
        n_tokens = int(body["max_tokens"])
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        base = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                "model": body["model"]}
        await asyncio.sleep(PREFILL_S)
        if chat:  # a role-only first chunk, as OpenAI sends: carries no token
            yield _sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(math.ceil(n_tokens / 2)):
            if i:
                await asyncio.sleep(state.chunk_gap_s)
            text = " tok tok"
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            yield _sse({**base, "choices": [{**choice, "finish_reason": None}]})
        yield _sse({**base, "choices": [{"index": 0, "finish_reason": "length",
                                         **({"delta": {}} if chat else {"text": ""})}]})
        if not body.get("fake_no_usage"):
            n_prompt = len(prompt.split())
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_tokens,
                     "total_tokens": n_prompt + n_tokens}
            yield _sse({**base, "choices": [], "usage": usage})
        yield "data: [DONE]\n\n"

    async def handle(request: Request, chat: bool):
        body = await request.json()
        state.count += 1
        state.bodies.append(body)
        state.paths.append(request.url.path)
        if state.count in state.fail_on:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        n_prompt = len((body["messages"][-1]["content"] if chat else body["prompt"]).split())
        queue.observe(QUEUE_S)
        queries.inc(n_prompt)
        hits.inc(n_prompt / 2)
        return StreamingResponse(stream(body, chat), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, chat=True)

    return app


@dataclass
class FakeServer:
    url: str
    state: FakeState
    prefill_s: float = PREFILL_S
    chunk_gap_s: float = CHUNK_GAP_S
    queue_s: float = QUEUE_S


@pytest.fixture(scope="session")
def _fake_server() -> Any:
    state = FakeState()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(state), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "fake server did not start"
    yield FakeServer(f"http://127.0.0.1:{port}", state)
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


@pytest.fixture
def fake_server(_fake_server: FakeServer) -> FakeServer:
    _fake_server.state.reset()
    return _fake_server



@pytest.fixture
def unused_port() -> int:
    """A port with (very probably) nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
