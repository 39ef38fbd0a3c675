"""One server process that holds several models and switches between them (vLLM's sleep mode,
level 1: the weights of every model stay in host memory; only the awake model has a KV cache).

    tokenmill serve-multi --model 'smol=' --model 'tiny=/models/tiny --dtype float32' --port 8000

Each model is a whole `tokenmill serve` app of its own (`build_app`: its engine, its loop thread,
its metrics registry labelled with its `model_name`), built in this process and never bound to a
port. `MultiModelApp` is the ASGI app in front:

    POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
        the body's `model` picks the hosted app; the request holds a place in that model's turn
        (model_turns.ModelTurns: waits while the model sleeps; the switch sleeps the drained awake
        engine and wakes this one) and is handed to the app as it came (body replayed)
    POST /abort_request   to the model whose recent requests hold that X-Request-Id
    GET /v1/models (every model, `awake` says which), /health (200 when all are up),
    GET /metrics (every model's series, merged by family, + tokenmill:model_switches_total,
    tokenmill:model_switch_seconds_total, tokenmill:model_awake, tokenmill:model_turn_waiting)
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from tokenmill.metrics.prometheus import CONTENT_TYPE
from tokenmill.server.errors import APIError, send_error
from tokenmill.server.middleware import _authorized
from tokenmill.server.model_turns import ModelTurns
from tokenmill.server.state import ServerState

MODEL_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"})
TURN_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
LOAD_POLL_S = 0.1


@dataclass
class HostedModel:
    name: str
    app: FastAPI  # build_app(...) over this model's engine
    state: ServerState


class MultiModelApp:
    def __init__(self, hosted: list[HostedModel], *, api_key: str | None = None, quantum_s: float = 2.0,
                 public_metrics: bool = False, max_request_body_bytes: int = 1 << 20) -> None:
        names = [h.name for h in hosted]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"models: names must be unique and at least one, got {names}")
        self.hosted = {h.name: h for h in hosted}
        self.api_key = api_key
        self.public_metrics = public_metrics
        self.max_body = max_request_body_bytes
        self.turns = ModelTurns(names, self._switch, quantum_s)
        self.ready = False
        self.registry = CollectorRegistry()
        self.switches = Counter("tokenmill:model_switches", "model switches (one asleep, another woken)",
                                registry=self.registry)
        self.switch_seconds = Counter("tokenmill:model_switch_seconds", "time spent switching models",
                                      registry=self.registry)
        self.awake = Gauge("tokenmill:model_awake", "1 for the awake model", ["model_name"], registry=self.registry)
        self.turn_waiting = Gauge("tokenmill:model_turn_waiting", "requests waiting for their model's turn",
                                  ["model_name"], registry=self.registry)
        self.control = self._control_app()

    # -- ASGI ---------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and (
                scope["path"] in MODEL_ROUTES or scope["path"] == "/abort_request"):
            await self._dispatch(scope, receive, send)
            return
        await self.control(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.api_key is not None and not _authorized(headers.get(b"authorization"), self.api_key):
            await send_error(send, APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                                            "authentication_error", code="invalid_api_key"))
            return
        body = await _read_body(receive, self.max_body)
        if body is None:
            await send_error(send, APIError(413, f"request body exceeds {self.max_body} bytes",
                                            code="request_too_large"), close=True)
            return
        try:
            fields = json.loads(body)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            await send_error(send, APIError(400, "the body must be a JSON object"))
            return
        replay = _replay(body, receive)
        if scope["path"] == "/abort_request":
            rid = fields.get("request_id")
            owner = next((h for h in self.hosted.values() if isinstance(rid, str) and h.state.request_ids.get(rid)),
                         next(iter(self.hosted.values())))  # none: that app answers 400/404
            await owner.app(scope, replay, send)
            return
        model = fields.get("model")
        hosted = self.hosted.get(model) if isinstance(model, str) else None
        if hosted is None:
            await send_error(send, APIError(404, f"The model `{model}` does not exist; this server serves "
                                                 f"{', '.join(self.hosted)}", "not_found_error", "model",
                                            "model_not_found"))
            return
        if scope["path"] not in TURN_ROUTES:  # the tokenizer alone: no need for the engine to be awake
            await hosted.app(scope, replay, send)
            return
        async with self.turns.turn(model):
            await hosted.app(scope, replay, send)

    # -- switching -----------------------------------------------------------------------------------
    async def _switch(self, asleep: str, awake: str) -> None:
        before = self.turns.clock()
        await self.hosted[asleep].state.engine.call(lambda engine: engine.sleep())
        try:
            await self.hosted[awake].state.engine.call(lambda engine: engine.wake_up())
        except Exception:
            await self.hosted[asleep].state.engine.call(lambda engine: engine.wake_up())
            raise
        self.switches.inc()
        self.switch_seconds.inc(self.turns.clock() - before)

    # -- the control routes ----------------------------------------------------------------------------
    def _control_app(self) -> FastAPI:
        app = FastAPI(title="tokenmill (several models)", lifespan=self._lifespan)

        def refused(request: Request, open_: bool = False) -> Response | None:
            if open_ or self.api_key is None or _authorized(request.headers.get("authorization", "").encode(),
                                                            self.api_key):
                return None
            return JSONResponse({"error": {"message": "invalid or missing API key (send 'Authorization: Bearer "
                                                      "KEY')", "type": "authentication_error", "param": None,
                                           "code": "invalid_api_key"}}, 401)

        @app.get("/health")
        async def health():
            if not self.ready:
                return JSONResponse({"status": "loading"}, 503)
            for h in self.hosted.values():
                status, body = h.state.health()
                if status != 200:
                    return JSONResponse({**body, "model": h.name}, status)
            return {"status": "ok", "awake": self.turns.awake}

        @app.get("/v1/models")
        async def models(request: Request):
            if (r := refused(request)) is not None:
                return r
            data = []
            for h in self.hosted.values():
                engine = h.state.engine
                cfg = getattr(engine.engine, "config", None) if engine is not None else None
                data.append({"id": h.name, "object": "model", "created": h.state.started_at, "owned_by": "tokenmill",
                             "root": cfg.model.path if cfg is not None else None,
                             "max_model_len": engine.max_model_len if engine is not None else None,
                             "awake": h.name == self.turns.awake and not self.turns.switching})
            return {"object": "list", "data": data}

        @app.get("/metrics")
        async def metrics(request: Request):
            if (r := refused(request, self.public_metrics)) is not None:
                return r
            texts = []
            for h in self.hosted.values():
                st = h.state
                if st.stat_logger is None:
                    continue
                if st.engine is not None:
                    st.stat_logger.observe_tables(*st.engine.table_sizes(), st.engine.kv_resident_bytes())
                texts.append(st.stat_logger.exposition().decode())
                self.awake.labels(h.name).set(1.0 if h.name == self.turns.awake else 0.0)
                self.turn_waiting.labels(h.name).set(self.turns.num_waiting(h.name))
            texts.append(generate_latest(self.registry).decode())
            return Response(merge_expositions(texts), media_type=CONTENT_TYPE)

        return app

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for h in self.hosted.values():
                await stack.enter_async_context(h.app.router.lifespan_context(h.app))
            await self._wait_loaded()
            for name, h in self.hosted.items():
                if name != self.turns.awake:
                    await h.state.engine.call(lambda engine: engine.sleep())
            self.ready = True
            yield

    async def _wait_loaded(self) -> None:
        while True:
            failed = [h.name for h in self.hosted.values() if h.state.load_error is not None]
            if failed:
                raise RuntimeError(f"models {failed} failed to load")
            if all(h.state.engine is not None for h in self.hosted.values()):
                return
            await asyncio.sleep(LOAD_POLL_S)

    def begin_drain(self) -> None:
        for h in self.hosted.values():
            h.state.begin_drain()


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then the client's own messages (a disconnect still arrives)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


def merge_expositions(texts: list[str]) -> str:
    """Several Prometheus text expositions as one: each family's HELP and TYPE once, then the
    samples of every exposition (they differ by their model_name label)."""
    families: dict[str, dict] = {}
    for text in texts:
        current = None
        for line in text.split("\n"):  # the format's line end (splitlines also cuts at U+2028 in a label)
            if not line.strip():
                continue
            if line.startswith(("# HELP ", "# TYPE ")):
                kind, name = line[2:6].lower(), line.split(" ", 3)[2]
                current = families.setdefault(name, {"help": None, "type": None, "samples": []})
                current[kind] = current[kind] or line  # the first exposition's HELP / TYPE
            elif current is not None:
                current["samples"].append(line)
    out = []
    for fam in families.values():
        out += [x for x in (fam["help"], fam["type"]) if x] + fam["samples"]
    return "\n".join(out) + "\n"
