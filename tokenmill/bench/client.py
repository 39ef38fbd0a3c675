"""One streamed request to an OpenAI-compatible server, timed on the client.

Timings use ``time.perf_counter``: the request starts just before the POST is sent; TTFT is the
time to the first streamed chunk that carries generated text; ITL are the gaps between successive
such chunks; E2E is the time until the stream ends. Token counts come from the server's ``usage``
(``stream_options.include_usage``); only when the server sends none do we count text chunks
instead and flag the record (``usage_reported = False``).

A failed request (HTTP error status, error event in the stream, exception, timeout) is kept with
``success = False`` and its ``error``; one cancelled by Ctrl-C gets ``error = "interrupted"``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenmill.bench.workloads import BenchError, BenchRequest
from tokenmill.sse_reader import sse_lines

if TYPE_CHECKING:  # httpx loads when a request is sent: every `tokenmill` command imports this module
    import httpx

INTERRUPTED = "interrupted"


@dataclass
class EndpointConfig:
    base_url: str
    model: str
    endpoint: str = "completions"  # or "chat"
    ignore_eos: bool = True
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestResult:
    index: int
    input_len: int  # expected prompt tokens
    max_tokens: int
    scheduled_s: float  # planned send time, seconds from the benchmark start
    start_s: float | None = None  # actual send time, seconds from the benchmark start
    success: bool = False
    error: str | None = None
    status_code: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # from usage
    output_tokens: int = 0  # from usage, else the number of text chunks
    usage_reported: bool = False
    num_chunks: int = 0  # chunks that carried text


def build_payload(cfg: EndpointConfig, req: BenchRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": cfg.model,
        "max_tokens": req.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    return body


def sse_data(line: str) -> str | None:
    """The payload of an SSE ``data:`` line, else None (comments, event names, blanks)."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def chunk_text(chunk: dict[str, Any]) -> str:
    parts = []
    for choice in chunk.get("choices") or []:
        parts.append(choice.get("text") or "")
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or "")
        parts.append(delta.get("reasoning_content") or "")
    return "".join(parts)


def chunk_error(chunk: dict[str, Any]) -> str | None:
    err = chunk.get("error")
    if err is None and chunk.get("object") != "error":
        return None
    if isinstance(err, dict):
        err = err.get("message", err)
    return f"stream error: {err or chunk.get('message')}"


def _carries_output(choice: dict[str, Any]) -> bool:
    """A choice that reports generation (text or a finish reason), unlike the role-only
    ``{"delta": {"role": "assistant", "content": ""}}`` chunk chat servers send first."""
    delta = choice.get("delta") or {}
    return bool(choice.get("finish_reason") or choice.get("text") or delta.get("content")
                or delta.get("reasoning_content"))


class _Stream:
    """Accumulates the timing of one response stream."""

    def __init__(self, result: RequestResult, start: float) -> None:
        self.r = result
        self.start = start
        self.last: float | None = None
        self.first_choice: float | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any], now: float) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if self.first_choice is None and any(_carries_output(c) for c in chunk.get("choices") or []):
            self.first_choice = now
        if not chunk_text(chunk):
            return
        self.r.num_chunks += 1
        if self.last is None:
            self.r.ttft_s = now - self.start
        else:
            self.r.itl_s.append(now - self.last)
        self.last = now

    def finish(self, now: float) -> None:
        r = self.r
        r.e2e_s = now - self.start
        if self.usage is not None:
            r.usage_reported = True
            r.prompt_tokens = self.usage.get("prompt_tokens")
            r.output_tokens = int(self.usage.get("completion_tokens") or 0)
        else:
            r.output_tokens = r.num_chunks
        if r.ttft_s is None and r.output_tokens > 0:
            # tokens were generated but no chunk carried text (special or held-back tokens only):
            # the first chunk that ended a choice stands in (never a role-only opening chunk),
            # else the end of the stream
            r.ttft_s = (self.first_choice if self.first_choice is not None else now) - self.start
        if r.output_tokens == 0 or r.ttft_s is None:
            r.error = "stream ended without output tokens"
        else:
            r.success = True


async def _consume(resp: httpx.Response, stream: _Stream) -> None:
    async for line in sse_lines(resp):
        data = sse_data(line)
        if not data:
            continue
        if data == "[DONE]":
            break
        now = time.perf_counter()
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise ValueError(f"bad SSE payload: {data[:100]!r}") from None
        if err := chunk_error(chunk):
            raise ValueError(err)
        stream.feed(chunk, now)


async def stream_request(
    client: httpx.AsyncClient, cfg: EndpointConfig, req: BenchRequest, result: RequestResult, t0: float
) -> None:
    """Send one request, filling in `result`; never raises except on cancellation."""
    import httpx
    payload = build_payload(cfg, req)
    start = time.perf_counter()
    result.start_s = start - t0
    stream = _Stream(result, start)
    try:
        async with client.stream("POST", cfg.url, json=payload, headers=cfg.headers) as resp:
            result.status_code = resp.status_code
            if resp.status_code != 200:
                body = (await resp.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {resp.status_code}: {' '.join(body.split())[:300]}"
                return
            await _consume(resp, stream)
        stream.finish(time.perf_counter())
    except asyncio.CancelledError:
        result.error = INTERRUPTED
        raise
    except httpx.TimeoutException as e:
        result.error = f"timeout: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - recorded, never dropped
        result.error = f"{type(e).__name__}: {e}"


async def list_models(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> list[str]:
    """Model ids from /v1/models ([] if the server has no such route); BenchError if unreachable."""
    import httpx
    url = base_url.rstrip("/") + "/v1/models"
    try:
        resp = await client.get(url, headers=headers, timeout=10.0)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach server at {base_url}: {type(e).__name__}: {e}".rstrip(": ")) from None
    if resp.status_code != 200:
        return []
    try:
        return [m["id"] for m in resp.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


async def fetch_metrics(client: httpx.AsyncClient, base_url: str) -> str | None:
    """The Prometheus exposition text at /metrics, or None if there is none."""
    import httpx
    try:
        resp = await client.get(base_url.rstrip("/") + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None
