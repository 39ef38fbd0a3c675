"""Forwarding one OpenAI request to the replica its lease names, streaming or not.

A stream is passed through line by line as the replica sends it. The fleet always asks the
replica for the final usage chunk (`stream_options.include_usage`), reads it for the ledger, and
drops it again when the client did not ask for it. Whatever way the request ends (done, failed,
client gone), `on_done(usage, status)` runs exactly once.
"""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi.responses import Response, StreamingResponse

from tokenmill.fleet.router import Lease
from tokenmill.fleet.runtime import Usage

OnDone = Callable[[Usage, str, float], Awaitable[None]]
FORWARDED_HEADERS = ("x-request-id",)


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
        usage, status = None, "aborted"  # until the stream's end is seen
        try:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    event = _json(line[6:])
                    if event is not None and "error" in event:
                        status = "error"
                    if event is not None and event.get("usage") and not event.get("choices"):
                        usage = event["usage"]
                        if not client_wants_usage:
                            continue
                elif line.startswith("data: [DONE]") and status == "aborted":
                    status = "ok"
                yield line + "\n"
        finally:
            await resp.aclose()
            await on_done(Usage.from_body(usage), status, time.monotonic() - start)

    return StreamingResponse(lines(), media_type="text/event-stream", headers=_headers(lease, out_headers))


def _json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
