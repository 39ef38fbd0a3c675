"""Forwarding one OpenAI request to the replica its lease names, streaming or not.

A stream is passed through line by line as the replica sends it. The fleet always asks the
replica for the final usage chunk (`stream_options.include_usage`), reads it for the ledger, and
drops it again when the client did not ask for it. Whatever way the request ends (done, failed,
client gone), `on_done(usage, status)` runs exactly once. A stream that ends before its last
chunk because the client left (disconnect, timeout) is *abandoned*: the fleet asks the replica to
abort it (`POST /abort_request` by X-Request-Id) and bills what the engine had charged it by then,
in a task of its own (the response's own task is being cancelled).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi.responses import Response, StreamingResponse

from tokenmill.fleet.router import Lease
from tokenmill.fleet.runtime import Usage
from tokenmill.sse_reader import sse_lines

OnDone = Callable[[Usage, str, float], Awaitable[None]]
FORWARDED_HEADERS = ("x-request-id",)
logger = logging.getLogger(__name__)
_billing: set[asyncio.Task] = set()  # abandoned requests being billed (kept referenced until done)


def _headers(lease: Lease, extra: dict[str, str]) -> dict[str, str]:
    return {"x-tokenmill-pool": lease.pool.name, "x-tokenmill-replica": lease.replica.name,
            "x-tokenmill-route-reason": lease.decision.reason.value, **extra}


async def forward(client: httpx.AsyncClient, lease: Lease, path: str, body: dict, headers: dict[str, str],
                  on_done: OnDone) -> Response:
    fwd = {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}
    start = time.monotonic()
    if body.get("stream"):
        return await _forward_stream(client, lease, path, body, fwd, on_done, start)
    try:
        r = await client.post(lease.replica.url + path, json=body, headers=fwd)
    except httpx.HTTPError:
        await on_done(Usage(), "error", time.monotonic() - start)
        raise
    usage = None
    if r.status_code == 200:
        try:
            usage = r.json().get("usage")
        except ValueError:
            pass
    await on_done(Usage.from_body(usage), "ok" if r.status_code == 200 else "error", time.monotonic() - start)
    out_headers = {k: v for k, v in r.headers.items() if k.lower() in FORWARDED_HEADERS + ("retry-after",)}
    return Response(r.content, r.status_code, headers=_headers(lease, out_headers),
                    media_type=r.headers.get("content-type"))


async def _forward_stream(client: httpx.AsyncClient, lease: Lease, path: str, body: dict, fwd: dict[str, str],
                          on_done: OnDone, start: float) -> Response:
    options = dict(body.get("stream_options") or {})
    client_wants_usage = bool(options.get("include_usage"))
    if not client_wants_usage:  # running counts in every chunk only for a client that asked for usage
        options.pop("continuous_usage_stats", None)
    upstream = {**body, "stream_options": {**options, "include_usage": True}}
    try:
        resp = await client.send(client.build_request("POST", lease.replica.url + path, json=upstream, headers=fwd),
                                 stream=True)
    except httpx.HTTPError:
        await on_done(Usage(), "error", time.monotonic() - start)
        raise
    out_headers = {k: v for k, v in resp.headers.items() if k.lower() in FORWARDED_HEADERS + ("retry-after",)}
    if resp.status_code != 200:
        content = await resp.aread()
        await resp.aclose()
        await on_done(Usage(), "error", time.monotonic() - start)
        return Response(content, resp.status_code, headers=_headers(lease, out_headers),
                        media_type=resp.headers.get("content-type"))

    async def lines() -> AsyncIterator[str]:
        usage, status = None, "abandoned"  # until the stream's end is seen
        try:
            async for line in _upstream_lines(resp):
                if line.startswith("data: {"):
                    event = _json(line[6:])
                    if event is not None and "error" in event:
                        status = "error"
                    if event is not None and event.get("usage") and not event.get("choices"):
                        usage = event["usage"]
                        if not client_wants_usage:
                            continue
                elif line.startswith("data: [DONE]") and status == "abandoned":
                    status = "ok"
                yield line + "\n"
        except _UpstreamError:
            status = "error"
            raise
        finally:
            await resp.aclose()
            if status == "abandoned" and usage is None:
                task = asyncio.get_running_loop().create_task(
                    _bill_abandoned(client, lease, fwd.get("x-request-id"), on_done, start))
                _billing.add(task)
                task.add_done_callback(_billing.discard)
            else:
                await on_done(Usage.from_body(usage), status, time.monotonic() - start)

    return StreamingResponse(lines(), media_type="text/event-stream", headers=_headers(lease, out_headers))


class _UpstreamError(Exception):
    """The replica's stream broke (not the client's)."""


async def _upstream_lines(resp: httpx.Response) -> AsyncIterator[str]:
    try:
        async for line in sse_lines(resp):
            yield line
    except httpx.HTTPError as e:
        raise _UpstreamError(str(e)) from e


async def _bill_abandoned(client: httpx.AsyncClient, lease: Lease, request_id: str | None, on_done: OnDone,
                          start: float) -> None:
    """The client left mid-stream: abort the request on its replica and bill what it used."""
    usage = None
    if request_id:
        try:
            r = await client.post(lease.replica.url + "/abort_request", json={"request_id": request_id},
                                  timeout=30.0)
            if r.status_code == 200:
                usage = r.json().get("usage")
            else:
                logger.warning("abandoned request %s: replica %s answered %d", request_id, lease.replica.name,
                               r.status_code)
        except (httpx.HTTPError, ValueError) as e:
            logger.warning("abandoned request %s: no usage from replica %s: %s", request_id, lease.replica.name, e)
    await on_done(Usage.from_body(usage), "abandoned", time.monotonic() - start)


def _json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
