"""The OpenAI-compatible HTTP server: FastAPI app (`build_app`) and `tokenmill serve` (`run_server`).

    python -m tokenmill.server [MODEL] --host 127.0.0.1 --port 8000 [--api-key KEY] [engine flags]

Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE with `stream`), GET /v1/models,
GET /health (503 while loading, shutting down, or after the engine loop died), GET /metrics
(Prometheus text). Every error is an OpenAI error body {"error": {message, type, param, code}}.

Safe defaults: loopback only; with --api-key every /v1 route needs `Authorization: Bearer KEY`
(401); bodies over --max-request-body-bytes get 413; more than --max-waiting-requests waiting
requests get 429 with Retry-After; X-Request-Id is echoed (one is made up when absent). On SIGTERM
the server stops admitting (503), lets in-flight requests finish for --shutdown-timeout seconds,
aborts the rest with a final error message, and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.metrics.prometheus import CONTENT_TYPE, PrometheusStatLogger
from tokenmill.server import cli_args
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from tokenmill.server.serving import APIError, OpenAIServing, load_chat_template

logger = logging.getLogger("tokenmill.server")

_BODY_METHODS = {"POST", "PUT", "PATCH"}


class ServerState:
    """What the routes need, and where the server is in its life (loading, ready, draining)."""

    def __init__(self, served_model_names: list[str] | None, api_key: str | None, max_waiting_requests: int,
                 price_per_hour: float, max_request_body_bytes: int, chat_template: str | None,
                 shutdown_timeout: float) -> None:
        self.served_model_names = served_model_names
        self.api_key = api_key
        self.max_waiting_requests = max_waiting_requests
        self.price_per_hour = price_per_hour
        self.max_request_body_bytes = max_request_body_bytes
        self.chat_template = chat_template
        self.shutdown_timeout = shutdown_timeout
        self.engine: AsyncLLMEngine | None = None
        self.serving: OpenAIServing | None = None
        self.stat_logger: PrometheusStatLogger | None = None
        self.load_error: BaseException | None = None
        self.draining = False
        self.on_fatal: Callable[[], None] | None = None  # run_server: stop the process
        self.started_at = int(time.time())

    # -- engine ---------------------------------------------------------------------------------
    def attach(self, engine: AsyncLLMEngine) -> None:
        """Register metrics and go live (called on the event loop once the engine exists)."""
        names = self.served_model_names or [engine.model_name]
        self.served_model_names = names
        if self.stat_logger is None:
            self.stat_logger = PrometheusStatLogger(names[0], self.price_per_hour)
        if self.stat_logger not in engine.engine.stat_loggers:
            engine.engine.stat_loggers.append(self.stat_logger)
        engine.start()
        self.serving = OpenAIServing(engine, names, self.chat_template)
        self.engine = engine
        if self.draining:
            engine.start_draining()
        logger.info("model %s ready (max_model_len=%d, KV cache %d tokens)", names[0], engine.max_model_len,
                    engine.kv_capacity_tokens)

    def health(self) -> tuple[int, dict]:
        if self.load_error is not None:
            return 503, {"status": "error", "message": f"model failed to load: {self.load_error}"}
        if self.engine is None:
            return 503, {"status": "loading"}
        if self.engine.dead_error is not None:
            return 503, {"status": "error", "message": f"engine loop died: {self.engine.dead_error!r}"}
        if self.draining or not self.engine.is_healthy:
            return 503, {"status": "shutting_down"}
        return 200, {"status": "ok"}

    def unavailable(self) -> APIError | None:
        """Why /v1 cannot serve now, or None."""
        if self.draining:
            return APIError(503, "the server is shutting down", "service_unavailable", None, "shutting_down")
        if self.load_error is not None:
            return APIError(503, f"the model failed to load: {self.load_error}", "service_unavailable", None,
                            "load_failed")
        if self.engine is None:
            return APIError(503, "the model is loading; retry shortly", "service_unavailable", None, "loading",
                            {"Retry-After": "1"})
        if self.engine.dead_error is not None:
            return APIError(503, f"the engine loop has died: {self.engine.dead_error!r}", "service_unavailable",
                            None, "engine_dead")
        return None

    def begin_drain(self) -> None:
        """SIGTERM: refuse new requests; abort what is still running after shutdown_timeout."""
        if self.draining:
            return
        self.draining = True
        logger.info("shutting down: no new requests; in-flight ones have %.1f s to finish", self.shutdown_timeout)
        if self.engine is not None:
            self.engine.start_draining()
            engine = self.engine
            asyncio.get_running_loop().call_later(self.shutdown_timeout, engine.abort_all,
                                                  "the server is shutting down; the request was aborted")


class GuardMiddleware:
    """Pure ASGI (never buffers responses, so SSE streams pass straight through): request id echo,
    API key on /v1, draining 503, and the request-body cap (413)."""

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        rid = headers.get(b"x-request-id") or uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*(h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"),
                                      (b"x-request-id", rid)]
            await send(message)

        st = self.state
        if scope["path"].startswith("/v1"):
            if st.api_key is not None and not _authorized(headers.get(b"authorization"), st.api_key):
                await _send_error(send_with_id, APIError(
                    401, "invalid or missing API key (send 'Authorization: Bearer KEY')", "invalid_request_error",
                    None, "invalid_api_key", {"WWW-Authenticate": "Bearer"}))
                return
            if st.draining:
                await _send_error(send_with_id, st.unavailable())
                return
        if scope.get("method") in _BODY_METHODS:
            too_big = APIError(413, f"request body exceeds {st.max_request_body_bytes} bytes", "invalid_request_error",
                               None, "request_too_large")
            length = headers.get(b"content-length")
            try:
                if length is not None and int(length) > st.max_request_body_bytes:
                    await _send_error(send_with_id, too_big, close=True)
                    return
            except ValueError:
                await _send_error(send_with_id, APIError(400, "invalid Content-Length"), close=True)
                return
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                size += len(body)
                if size > st.max_request_body_bytes:
                    await _send_error(send_with_id, too_big, close=True)
                    return
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

            async def receive_replayed():
                return replay.pop() if replay else await receive()

            await self.app(scope, receive_replayed, send_with_id)
            return
        await self.app(scope, receive, send_with_id)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server already stopped (e.g. SIGTERM while loading)
        pass


def _authorized(header: bytes | None, key: str) -> bool:
    if not header:
        return False
    expected = f"Bearer {key}".encode()
    return hmac.compare_digest(header.strip(), expected)


async def _send_error(send, err: APIError, close: bool = False) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _validation_error(e: ValidationError | RequestValidationError) -> APIError:
    errors = e.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body",)]
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        code="invalid_json")
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    return APIError(400, f"{where}: {first.get('msg', 'invalid value')}", param=param, code="invalid_value")


def build_app(engine_client: AsyncLLMEngine | Any | Callable[[], Any], *,
              served_model_names: list[str] | None = None, api_key: str | None = None,
              max_waiting_requests: int = cli_args.DEFAULT_MAX_WAITING_REQUESTS,
              price_per_hour: float = cli_args.DEFAULT_PRICE_PER_HOUR,
              max_request_body_bytes: int = cli_args.DEFAULT_MAX_REQUEST_BODY_BYTES,
              chat_template: str | None = None,
              shutdown_timeout: float = cli_args.DEFAULT_SHUTDOWN_TIMEOUT_S) -> FastAPI:
    """The app over an engine: an AsyncLLMEngine, an LLMEngine (wrapped here), or a zero-argument
    callable that builds an LLMEngine; the callable runs in a background thread at startup while
    /health answers 503 "loading"."""
    state = ServerState(served_model_names, api_key, max_waiting_requests, price_per_hour, max_request_body_bytes,
                        chat_template, shutdown_timeout)

    def wrap(engine) -> AsyncLLMEngine:
        if isinstance(engine, AsyncLLMEngine):
            return engine
        return AsyncLLMEngine(engine, max_waiting_requests=max_waiting_requests, start=False)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        if isinstance(engine_client, AsyncLLMEngine) or hasattr(engine_client, "step"):
            state.attach(wrap(engine_client))
        else:
            def load() -> None:
                try:
                    engine = wrap(engine_client())
                except BaseException as e:
                    logger.error("the model failed to load: %s", e)
                    state.load_error = e
                    if state.on_fatal is not None:
                        _call_soon(loop, state.on_fatal)
                    return
                _call_soon(loop, state.attach, engine)

            threading.Thread(target=load, name="tokenmill-model-loader", daemon=True).start()
        try:
            yield
        finally:
            state.draining = True
            if state.engine is not None:
                await asyncio.to_thread(state.engine.shutdown)

    app = FastAPI(title="tokenmill", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.tokenmill = state
    app.add_middleware(GuardMiddleware, state=state)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, e: RequestValidationError):
        return _validation_error(e).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(e.status_code, "invalid_request_error")
        return JSONResponse(error_body(str(e.detail), kind, None, e.status_code), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):  # last resort: still an OpenAI body
        logger.exception("unexpected error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), status_code=500)

    async def parse(request: Request, model):
        arrival = time.monotonic()
        err = state.unavailable()
        if err is not None:
            raise err
        body = await request.body()
        try:
            return model.model_validate_json(body), arrival
        except ValidationError as e:
            raise _validation_error(e) from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        req, arrival = await parse(request, CompletionRequest)
        return await state.serving.completions(req, request, arrival)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req, arrival = await parse(request, ChatCompletionRequest)
        return await state.serving.chat(req, request, arrival)

    @app.get("/v1/models")
    async def models():
        err = state.unavailable()
        if err is not None:
            raise err
        root = str(state.engine.engine.model_folder) if hasattr(state.engine.engine, "model_folder") else None
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": state.started_at, "owned_by": "tokenmill", "root": root,
             "max_model_len": state.engine.max_model_len} for name in state.served_model_names]}

    @app.get("/health")
    async def health():
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics():
        data = state.stat_logger.exposition() if state.stat_logger is not None else b""
        return Response(data, media_type=CONTENT_TYPE)

    return app


# -- the process ---------------------------------------------------------------------------------
class _Server(uvicorn.Server):
    """uvicorn.Server that starts draining on the first SIGTERM/SIGINT and, unlike uvicorn, does
    not re-raise the signal after shutting down, so a SIGTERM ends the process with status 0."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[int], None]) -> None:
        super().__init__(config)
        self.on_signal = on_signal

    def handle_exit(self, sig: int, frame) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:
            self.on_signal(sig)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in originals.items():
                signal.signal(s, handler)


def run_server(args: argparse.Namespace) -> int:
    """`tokenmill serve`: returns the process exit status (0 after SIGTERM or SIGINT, 1 if the model
    fails to load, 2 for bad flags, 3 (uvicorn's) if the port cannot be bound)."""
    import prometheus_client

    from tokenmill.engine.engine import LLMEngine

    prometheus_client.disable_created_metrics()  # no *_created series: they only clutter /metrics
    level = getattr(args, "log_level", "info")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = cli_args.engine_config_from_args(args)
        chat_template = load_chat_template(getattr(args, "chat_template", None))
    except (ValueError, OSError) as e:
        print(f"tokenmill serve: error: {e}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        logger.warning("binding to %s without --api-key: anyone who can reach this address can use the server",
                       args.host)
    app = build_app(lambda: LLMEngine(config), served_model_names=args.served_model_name, api_key=args.api_key,
                    max_waiting_requests=args.max_waiting_requests, price_per_hour=args.price_per_hour,
                    max_request_body_bytes=args.max_request_body_bytes, chat_template=chat_template,
                    shutdown_timeout=args.shutdown_timeout)
    state: ServerState = app.state.tokenmill
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=level, lifespan="on",
                               access_log=not getattr(args, "disable_access_log", False),
                               timeout_graceful_shutdown=args.shutdown_timeout + 5.0)
    def on_signal(sig: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_soon_threadsafe(state.begin_drain)

    server = _Server(uv_config, on_signal)

    def on_fatal() -> None:
        server.should_exit = True

    state.on_fatal = on_fatal
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits this way when it cannot bind
        return e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        return 130
    if state.load_error is not None:
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_server(cli_args.make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
