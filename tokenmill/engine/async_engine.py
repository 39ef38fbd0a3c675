"""AsyncLLMEngine: the LLMEngine step loop in its own thread, streaming RequestOutputs to asyncio.

Threads and ownership:
- The loop thread owns the LLMEngine: only it calls add_request / step / abort_request.
- asyncio code hands it commands (add, abort) through a list guarded by a Condition, and the loop
  thread sleeps on that Condition while it has nothing to do (no busy spin).
- Outputs go back with one `loop.call_soon_threadsafe` per step and event loop, into each
  request's `RequestStream`. Outputs are cumulative, so a stream keeps only the latest one per
  request (a slow consumer skips to it; memory stays bounded); the server's `OutputDeltas`
  (tokenmill/server/deltas.py) turns cumulative outputs into text / token-id / logprob deltas.
- A stream that is closed before its requests finish (client disconnect, cancellation) aborts them,
  which frees their KV blocks on the next turn of the loop.
- A request that fails inside the step (FinishReason.ERROR: the executor raised RequestStepError for
  it) ends its stream with `RequestFailedError`; the other requests keep running.
- If the engine raises, the engine is declared dead: every open stream and every pending add gets
  `EngineDeadError` (never a hang) and `is_healthy` turns False. When the loop stops (dead or shut
  down) it sets `_closed` under the Condition; an add submitted after that fails at once.
- Test hook: `TOKENMILL_TEST_STEP_DELAY_S` (seconds) makes the loop sleep after every step, so tests
  can observe a request while it runs whatever the machine's speed.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from tokenmill.engine.ended_usage import EndedUsage
from tokenmill.engine.errors import (
    EngineDeadError,
    EngineShutdownError,
    QueueFullError,
    RequestAbortedError,
    RequestFailedError,
)
from tokenmill.engine.request_stream import RequestStream, call_in_loop, deliver_all, set_exception, set_result
from tokenmill.request import FinishReason, RequestOutput
from tokenmill.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.005  # wait when the engine has requests but scheduled nothing (never spins)
STEP_DELAY_ENV = "TOKENMILL_TEST_STEP_DELAY_S"  # test-only: sleep this long after each step


@dataclass
class _Add:
    requests: list[tuple[str, Any, SamplingParams, float]]
    stream: RequestStream
    future: asyncio.Future


@dataclass
class _Abort:
    request_ids: list[str]
    error: BaseException | None = None  # delivered to the stream, if it is still open


@dataclass
class _AbortAll:
    error: BaseException


@dataclass
class _Call:
    """Run fn(engine) on the loop thread (between steps) and answer the future with its result."""
    fn: Callable[[Any], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class AsyncLLMEngine:
    def __init__(self, engine, max_waiting_requests: int | None = None, start: bool = True) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._cond = threading.Condition()
        self._commands: list = []
        self._streams: dict[str, RequestStream] = {}  # owned by the loop thread
        self._pending_adds = 0  # requests handed over but not yet in the engine (guarded by _cond)
        self._stop = False
        self._closed = False  # set by the loop thread, under _cond, once it stops taking commands
        self._step_delay_s = float(os.environ.get(STEP_DELAY_ENV) or 0.0)
        self._draining = False
        self.dead_error: BaseException | None = None
        self.on_dead: Callable[[], None] | None = None  # called from the loop thread once it has died
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- facts about the engine (read-only, safe from any thread) ------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_capacity_tokens(self) -> int:
        return self.engine.kv_capacity_tokens

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def generation_defaults(self) -> dict:
        """The model's sampling defaults (generation_config.json): requests that leave a field unset get them."""
        return getattr(self.engine, "generation_defaults", {})

    def next_request_id(self) -> str:
        return self.engine.next_request_id()

    def table_sizes(self) -> tuple[int, int, int]:
        """(KV blocks in use, requests in the engine's table, open output streams): all 0 when idle.
        Read without the loop's lock (single int reads: a scrape may be one step stale)."""
        core = getattr(self.engine, "core", None)
        used = core.kv.pool.num_used_blocks if core is not None else 0
        return used, self.engine.get_num_unfinished_requests(), len(self._streams)

    def kv_resident_bytes(self) -> int:
        """Bytes of the KV cache the OS has mapped so far (-1: unknown); read without the loop's lock."""
        from tokenmill.attention.kv_cache import resident_bytes
        runner = getattr(self.engine, "runner", None)
        return resident_bytes(list(runner.kv_caches)) if runner is not None else 0

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def is_healthy(self) -> bool:
        return self.dead_error is None and self.is_running and not self._stop

    def num_waiting(self) -> int:
        """Requests not yet running: handed over plus waiting in the scheduler (incl. preempted)."""
        with self._cond:  # the loop thread moves requests from one count to the other under it
            return self._pending_adds + self.engine.num_waiting_requests()

    def check_capacity(self, n: int = 1) -> None:
        """QueueFullError when n more requests would exceed the waiting cap (callable from any thread:
        the server sheds on it before it reads a request's body)."""
        if self.max_waiting_requests is not None and self.num_waiting() + n > self.max_waiting_requests:
            raise QueueFullError(f"too many requests waiting (limit {self.max_waiting_requests}); retry later")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tokenmill-engine-loop", daemon=True)
        self._thread.start()

    def start_draining(self) -> None:
        """Refuse new requests from now on (in-flight ones continue)."""
        self._draining = True

    def abort_all(self, message: str = "the server is shutting down") -> None:
        self._submit(_AbortAll(EngineShutdownError(message)))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop: open streams get EngineShutdownError and their requests are aborted."""
        self._draining = True
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- requests (event-loop side) -------------------------------------------------------------
    async def add_requests(self, requests: list[tuple[str, Any, SamplingParams]],
                           arrival_time: float | None = None) -> RequestStream:
        """Hand requests (request_id, prompt, params) to the engine; all or none are added.
        Raises ValueError (invalid request), QueueFullError, EngineDeadError, EngineShutdownError."""
        self._check_accepting()
        self.check_capacity(len(requests))
        loop = asyncio.get_running_loop()
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        stream = RequestStream(self, [r[0] for r in requests], loop)
        fut = loop.create_future()
        self._submit(_Add([(rid, prompt, params, arrival) for rid, prompt, params in requests], stream, fut))
        try:
            await fut
        except asyncio.CancelledError:
            stream.abort()
            raise
        return stream

    async def add_request(self, request_id: str, prompt, params: SamplingParams,
                          arrival_time: float | None = None) -> RequestStream:
        return await self.add_requests([(request_id, prompt, params)], arrival_time)

    async def generate(self, prompt, params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative RequestOutputs of one request until it finishes (aborted if left early)."""
        stream = await self.add_request(request_id or self.next_request_id(), prompt, params)
        async for out in stream:
            yield out

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(engine) on the loop thread, between steps (sleep / wake_up); its result or exception."""
        self._check_accepting()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(_Call(fn, future, loop))
        return await future

    async def abort_with_usage(self, request_ids: list[str]) -> list[EndedUsage | None]:
        """Abort the requests that still run and say what each used (None: ended too long ago)."""
        ids = list(request_ids)
        self._check_accepting()
        self._submit(_Abort(ids, RequestAbortedError("the request was aborted")))
        return await self.call(lambda engine: [engine.ended_usage.get(rid) for rid in ids])  # after the abort

    def abort(self, request_ids: str | list[str]) -> None:
        """Abort requests (thread-safe, non-blocking); their KV blocks are freed on the next turn."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        if ids and self.is_running:
            self._submit(_Abort(ids))

    def _check_accepting(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine loop has died: {self.dead_error!r}")
        if self._draining or self._stop:
            raise EngineShutdownError("the server is shutting down")
        if not self.is_running:
            raise EngineShutdownError("the engine loop is not running")

    def _submit(self, command) -> None:
        with self._cond:
            if self._closed:  # the loop has stopped: nobody would ever answer this command
                if isinstance(command, (_Add, _Call)):
                    set_exception(command.future, self._closed_error())
                return
            if isinstance(command, _Add):
                self._pending_adds += len(command.requests)
            self._commands.append(command)
            self._cond.notify()

    def _closed_error(self) -> BaseException:
        if self.dead_error is not None:
            return EngineDeadError(f"the engine loop has died: {self.dead_error!r}")
        return EngineShutdownError("the server is shutting down")

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._cond:
                    while not self._commands and not self._stop and not engine.has_unfinished_requests():
                        self._cond.wait()
                    commands, self._commands = self._commands, []
                    stop = self._stop
                if commands:
                    self._process(commands)
                if stop:
                    break
                if engine.has_unfinished_requests():
                    t0 = time.monotonic()
                    outputs = engine.step()
                    self._dispatch(outputs)
                    if self._step_delay_s and outputs:
                        time.sleep(self._step_delay_s)
                    if not outputs and time.monotonic() - t0 < 1e-3:
                        with self._cond:  # scheduled nothing: wait a little for news, never spin
                            if not self._commands and not self._stop:
                                self._cond.wait(_IDLE_POLL_S)
        except BaseException as e:
            logger.exception("engine loop died")
            self.dead_error = e
            self._fail_everything(EngineDeadError(f"the engine loop has died: {e!r}"))
            if self.on_dead is not None:
                self.on_dead()
            return
        self._fail_everything(EngineShutdownError("the server is shutting down"))

    def _process(self, commands: list) -> None:
        engine = self.engine
        aborted = False
        for cmd in commands:
            if isinstance(cmd, _Add):
                self._process_add(cmd)
            elif isinstance(cmd, _Abort):
                for rid in cmd.request_ids:
                    engine.abort_request(rid)
                    stream = self._streams.pop(rid, None)
                    if stream is not None and cmd.error is not None:
                        call_in_loop(stream.loop, stream._deliver, cmd.error)
                aborted = True
            elif isinstance(cmd, _Call):
                try:
                    call_in_loop(cmd.loop, set_result, cmd.future, cmd.fn(engine))
                except Exception as e:
                    call_in_loop(cmd.loop, set_exception, cmd.future, e)
            elif isinstance(cmd, _AbortAll):
                for rid, stream in list(self._streams.items()):
                    engine.abort_request(rid)
                    call_in_loop(stream.loop, stream._deliver, cmd.error)
                self._streams.clear()
                aborted = True
        if aborted:
            self._refresh_stats()

    def _process_add(self, cmd: _Add) -> None:
        engine = self.engine
        added = []
        # Under the lock, so num_waiting() never counts a request both as handed over and waiting.
        with self._cond:
            self._pending_adds -= len(cmd.requests)
            try:
                if self._stop or self._draining:
                    raise EngineShutdownError("the server is shutting down")
                for rid, prompt, params, arrival in cmd.requests:
                    engine.add_request(rid, prompt, params, arrival_time=arrival)
                    added.append(rid)
            except Exception as e:
                for rid in added:
                    engine.abort_request(rid)
                call_in_loop(cmd.stream.loop, set_exception, cmd.future, e)
                return
        for rid in added:
            self._streams[rid] = cmd.stream
        call_in_loop(cmd.stream.loop, set_result, cmd.future, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
                if any(c.finish_reason == FinishReason.ERROR.value for c in out.outputs):
                    out = RequestFailedError(out.request_id)  # the stream raises it (and aborts its others)
            batches[stream.loop].append((stream, out))
        for loop, items in batches.items():
            call_in_loop(loop, deliver_all, items)

    def _fail_everything(self, error: BaseException) -> None:
        with self._cond:
            self._closed = True
            commands, self._commands = self._commands, []
            self._pending_adds = 0
        for cmd in commands:
            if isinstance(cmd, _Add):
                call_in_loop(cmd.stream.loop, set_exception, cmd.future, error)
        for rid, stream in list(self._streams.items()):
            try:
                self.engine.abort_request(rid)
            except Exception:
                pass
            call_in_loop(stream.loop, stream._deliver, error)
        self._streams.clear()

    def _refresh_stats(self) -> None:
        """Aborts free blocks outside a step: give the stat loggers fresh gauges."""
        try:
            self.engine.log_stats()
        except Exception:
            logger.exception("stat refresh failed")
