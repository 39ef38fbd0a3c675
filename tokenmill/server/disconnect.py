"""Non-streaming responses: wait for the final outputs, and abort the requests if the client leaves."""
from __future__ import annotations

import asyncio

from starlette.requests import Request

from tokenmill.engine.request_stream import RequestStream
from tokenmill.request import RequestOutput


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def wait_disconnect(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(stream: RequestStream, raw: Request | None) -> dict[str, RequestOutput]:
    """The final output of every request of the stream; raises ClientGone (after aborting them)
    if the client disconnects first."""
    latest: dict[str, RequestOutput] = {}

    async def consume() -> None:
        while not stream.finished:
            for out in await stream.next_outputs():
                latest[out.request_id] = out

    task = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(wait_disconnect(raw)) if raw is not None else None
    try:
        done, _ = await asyncio.wait({task} | ({watch} if watch else set()), return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
            return latest
        raise ClientGone()
    finally:
        task.cancel()
        if watch is not None:
            watch.cancel()
        stream.abort()
