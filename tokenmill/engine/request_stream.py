"""A request's stream of outputs on the asyncio side of AsyncLLMEngine, and the helpers the loop
thread uses to hand results to an event loop (`loop.call_soon_threadsafe`, tolerant of a closed
loop and of futures already done)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from tokenmill.request import RequestOutput

if TYPE_CHECKING:
    from tokenmill.engine.async_engine import AsyncLLMEngine


class RequestStream:
    """The outputs of one or more engine requests (e.g. the prompts of one API call).

    Iterate it (or call `next_outputs`) to get RequestOutputs; it ends when every request has
    finished. Outputs are cumulative, so only the latest one per request is kept until read: a slow
    reader skips intermediate ones and memory stays bounded. Closing it early (break,
    cancellation, `abort()`) aborts the requests that have not finished."""

    def __init__(self, engine: AsyncLLMEngine, request_ids: list[str], loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.request_ids = list(request_ids)
        self.loop = loop
        self.unfinished = set(request_ids)
        self._latest: dict[str, RequestOutput] = {}
        self._error: BaseException | None = None
        self._news = asyncio.Event()
        self._closed = False

    def _deliver(self, item: RequestOutput | BaseException) -> None:  # event-loop thread
        if isinstance(item, BaseException):
            if self._error is None:
                self._error = item
        else:
            self._latest[item.request_id] = item
        self._news.set()

    @property
    def finished(self) -> bool:
        return not self.unfinished

    async def next_outputs(self) -> list[RequestOutput]:
        """Wait for news; returns the latest output of each request that changed (in arrival
        order). Raises the engine's error if there is one; [] once everything has finished."""
        if not self.unfinished:
            return []
        await self._news.wait()
        self._news.clear()
        if self._error is not None:
            self.abort()
            raise self._error
        latest, self._latest = self._latest, {}
        for rid, out in latest.items():
            if out.finished:
                self.unfinished.discard(rid)
        return list(latest.values())

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while self.unfinished:
                for out in await self.next_outputs():
                    yield out
        finally:
            self.abort()

    def abort(self) -> None:
        """Abort the requests that have not finished (idempotent, synchronous, never raises)."""
        if self._closed:
            return
        self._closed = True
        if self.unfinished:
            self.engine.abort(list(self.unfinished))
            self.unfinished.clear()


def call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the event loop is closed: nobody is listening any more
        pass


def set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def deliver_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    for stream, out in items:
        stream._deliver(out)
