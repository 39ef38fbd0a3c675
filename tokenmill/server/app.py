"""The OpenAI-compatible HTTP app: `build_app` and its routes.

Routes: POST /v1/completions, POST /v1/chat/completions (JSON or SSE with `stream`), GET /v1/models
and /v1/models/{id}, GET /version, GET|POST /ping (= /health),
POST /tokenize and /detokenize (vLLM's), with --enable-sleep-mode POST /sleep, POST /wake_up, GET
/is_sleeping (vLLM's sleep mode: the KV cache released, weights kept; 409 while requests are unfinished),
POST /abort_request (abort one request by its X-Request-Id and answer its usage: a fleet billing
an abandoned request), GET /v1/kv/events (the prefix cache's stored/evicted block hashes, for KV-aware routers),
GET /health (503 while loading, shutting down, or after the engine loop died), GET /metrics
(Prometheus text). Every error is an OpenAI error body {"error": {message, type, param, code}}.
Serving the process (`run_server`, `main`, SIGTERM) is in launch.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tokenmill import __version__
from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.metrics.prometheus import CONTENT_TYPE
from tokenmill.server import cli_args
from tokenmill.server.errors import APIError, add_exception_handlers, validation_error
from tokenmill.server.middleware import GuardMiddleware
from tokenmill.server.openapi import install_openapi, json_body
from tokenmill.server.serving import ended_usage_body
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from tokenmill.server.state import ServerState

logger = logging.getLogger("tokenmill.server")

EngineSource = Any  # an AsyncLLMEngine, an LLMEngine, or a zero-argument callable that builds one


def build_app(engine_client: EngineSource, *,
              served_model_names: list[str] | None = None, api_key: str | None = None,
              max_waiting_requests: int = cli_args.DEFAULT_MAX_WAITING_REQUESTS,
              price_per_hour: float = cli_args.DEFAULT_PRICE_PER_HOUR,
              max_request_body_bytes: int = cli_args.DEFAULT_MAX_REQUEST_BODY_BYTES,
              chat_template: str | None = None,
              shutdown_timeout: float = cli_args.DEFAULT_SHUTDOWN_TIMEOUT_S, log_stats: bool = True,
              max_request_header_bytes: int = cli_args.DEFAULT_MAX_REQUEST_HEADER_BYTES,
              public_metrics: bool = False, allowed_origins: list[str] | None = None,
              log_prompts: bool = False,
              max_engine_restarts: int = cli_args.DEFAULT_MAX_ENGINE_RESTARTS,
              enable_sleep_mode: bool = False) -> FastAPI:
    """The app over an engine: an AsyncLLMEngine, an LLMEngine (wrapped here), or a zero-argument
    callable that builds an LLMEngine; the callable runs in a background thread at startup while
    /health answers 503 "loading"."""
    state = ServerState(served_model_names, api_key, max_waiting_requests, price_per_hour, max_request_body_bytes,
                        chat_template, shutdown_timeout, log_stats, max_request_header_bytes, public_metrics,
                        log_prompts, max_engine_restarts)
    app = FastAPI(title="tokenmill", summary="OpenAI-compatible LLM server",
                  lifespan=_lifespan(state, engine_client, max_waiting_requests))
    app.state.tokenmill = state
    app.add_middleware(GuardMiddleware, state=state)
    if allowed_origins:  # outermost: a browser's preflight (no credentials) is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["X-Request-Id", "Retry-After"])
    add_exception_handlers(app)
    _add_routes(app, state)
    if enable_sleep_mode:
        _add_sleep_routes(app, state)
    install_openapi(app, [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest, AbortRequest])
    return app


def _lifespan(state: ServerState, engine_client: EngineSource, max_waiting_requests: int):
    def wrap(engine) -> AsyncLLMEngine:
        if isinstance(engine, AsyncLLMEngine):
            return engine
        return AsyncLLMEngine(engine, max_waiting_requests=max_waiting_requests, start=False)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        if isinstance(engine_client, AsyncLLMEngine) or hasattr(engine_client, "step"):
            first = wrap(engine_client)
            state.engine_factory = lambda: wrap(_fresh_like(first.engine))
            state.attach(first)
        else:
            state.engine_factory = lambda: wrap(engine_client())

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

            state.loader = threading.Thread(target=load, name="tokenmill-model-loader", daemon=True)
            state.loader.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.close)

    return lifespan


def _fresh_like(engine):
    """A new engine with the configuration of `engine` (what a restart builds)."""
    return type(engine)(engine.engine_config)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the server already stopped (e.g. SIGTERM while loading)
        pass


class AbortRequest(BaseModel):
    """POST /abort_request's body (a tokenmill extension)."""
    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=128, description="the X-Request-Id of the request")


def _add_routes(app: FastAPI, state: ServerState) -> None:
    async def parse(request: Request, model: type[BaseModel]) -> tuple[Any, float]:
        arrival = time.monotonic()
        err = state.unavailable()
        if err is not None:
            raise err
        body = await request.body()
        try:
            return model.model_validate_json(body), arrival
        except ValidationError as e:
            raise validation_error(e) from None

    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(request: Request):
        req, arrival = await parse(request, CompletionRequest)
        return await state.completion.create_completion(req, request, arrival)

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request):
        req, arrival = await parse(request, ChatCompletionRequest)
        return await state.chat.create_chat_completion(req, request, arrival)

    @app.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize(request: Request):
        req, _ = await parse(request, TokenizeRequest)
        return await state.tokenization.tokenize(req)

    @app.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(request: Request):
        req, _ = await parse(request, DetokenizeRequest)
        return await state.tokenization.detokenize(req)

    def model_cards() -> list[dict]:
        err = state.unavailable()
        if err is not None:
            raise err
        config = getattr(state.engine.engine, "config", None)
        root = config.model.path if config is not None else None
        return [{"id": name, "object": "model", "created": state.started_at, "owned_by": "tokenmill", "root": root,
                 "max_model_len": state.engine.max_model_len} for name in state.served_model_names]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": model_cards()}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        """OpenAI's models.retrieve."""
        card = next((c for c in model_cards() if c["id"] == model), None)
        if card is None:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                                f"{', '.join(state.served_model_names)}", "not_found_error", "model", "model_not_found")
        return card

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.post("/abort_request", openapi_extra=json_body(AbortRequest))
    async def abort_request(request: Request):
        """Abort the engine requests of one HTTP request (by its X-Request-Id) if they still run, and
        answer what they used: how a fleet bills a request whose client left mid-stream."""
        req, _ = await parse(request, AbortRequest)
        http_id = req.request_id
        ids = state.request_ids.get(http_id) or []  # none: not a recent request here (found: false, usage 0)
        usages = [u for u in await state.engine.abort_with_usage(ids) if u is not None] if ids else []
        return {"request_id": http_id, "found": bool(ids), "aborted": any(u.aborted for u in usages),
                "complete": bool(ids) and len(usages) == len(ids), "usage": ended_usage_body(usages)}

    @app.get("/v1/kv/events")
    async def kv_events(since: int = 0):
        """Block hashes this engine's prefix cache stored and evicted since `since` (a KV-aware
        router's view of the cache; see tokenmill/core/kv_events.py), with the role and what a
        router needs to hash prompts the same way (block size, hash key)."""
        err = state.unavailable()
        if err is not None:
            raise err
        engine = state.engine.engine
        batch = engine.core.kv.pool.events.since(since)
        return {"seq": batch.seq, "reset": batch.reset, "stored": [h.hex() for h in batch.stored],
                "removed": [h.hex() for h in batch.removed], "block_size": engine.config.cache.block_size,
                "hash_key": engine.config.cache.block_hash_key, "role": engine.config.kv_role}

    @app.get("/health")
    @app.get("/ping")  # vLLM's (and SageMaker's) name for the same probe
    @app.post("/ping", include_in_schema=False)  # no body: nothing for a schema fuzzer to vary
    async def health():
        status, body = state.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics():
        if state.stat_logger is not None and state.engine is not None:
            state.stat_logger.observe_tables(*state.engine.table_sizes(), state.engine.kv_resident_bytes())
        data = state.stat_logger.exposition() if state.stat_logger is not None else b""
        return Response(data, media_type=CONTENT_TYPE)


def _add_sleep_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's sleep-mode endpoints (with --enable-sleep-mode): a fleet switching models on one
    device drains an engine, puts it to sleep (KV cache released, weights kept) and wakes another."""
    @app.post("/sleep")
    async def sleep():
        return await _sleep_call(lambda engine: engine.sleep())

    @app.post("/wake_up")
    async def wake_up():
        return await _sleep_call(lambda engine: engine.wake_up())

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": bool(state.engine is not None and state.engine.engine.is_sleeping)}

    async def _sleep_call(fn):
        err = state.unavailable()
        if err is not None:
            raise err
        try:
            await state.engine.call(fn)
        except RuntimeError as e:  # unfinished requests: say so, the caller drains first
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error", "code": "busy",
                                           "param": None}}, status_code=409)
        return {"is_sleeping": state.engine.engine.is_sleeping}


def __getattr__(name: str):
    # `tokenmill.server.app.run_server` / `.main` (older imports); lazy: launch.py imports this module
    if name in ("run_server", "main"):
        from tokenmill.server import launch
        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
