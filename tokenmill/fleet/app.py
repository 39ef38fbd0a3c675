"""The fleet's HTTP front: one OpenAI endpoint over every pool.

    POST /v1/completions, /v1/chat/completions   routed by `model` (which pools), the API key
                                                 (`Authorization: Bearer KEY`: the tenant and its SLO
                                                 class) and optionally `X-SLO-Class` (another class)
    GET  /v1/models      the fleet's models        GET /health   200 once every replica is up
    GET  /metrics        tokenmill:fleet_* series  GET /dashboard, /dashboard/data (JSON), static files

Answers: 401 unknown key, 400 bad body or class, 404 unknown model, 429 + Retry-After when shed,
503 when no replica serves the model; responses carry x-tokenmill-pool / -replica / -route-reason.
With `admin_api_key` in the config, /metrics and /dashboard* answer 401 without it (a scraper sends
`Authorization: Bearer KEY`; a browser gets a Basic challenge and sends it as the password).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import uuid
from importlib import resources

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from tokenmill.fleet import dashboard_data
from tokenmill.fleet.policy import Reason
from tokenmill.fleet.proxy import forward
from tokenmill.fleet.router import Shed
from tokenmill.fleet.runtime import FleetRuntime, Usage
from tokenmill.metrics.prometheus import CONTENT_TYPE

SLO_HEADER = "x-slo-class"
DASHBOARD_FILES = {"index.html", "dashboard.js", "charts.js", "dashboard.css"}


def error(status: int, message: str, type_: str, code: str | None = None, param: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "code": code, "param": param}}, status,
                        headers=headers)


def dashboard_dir():
    return resources.files("tokenmill.fleet") / "dashboard"


def admin_key_of(request: Request) -> str:
    """The key a request offers: `Bearer KEY`, or `Basic base64(user:KEY)` (what a browser sends)."""
    auth = request.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return ""
    return ""


def build_fleet_app(runtime: FleetRuntime, start_replicas: bool = True) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if start_replicas:
            await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app = FastAPI(title="tokenmill fleet", lifespan=lifespan)
    config = runtime.config

    def admin(request: Request) -> None:
        """/metrics and /dashboard*: 401 without the admin key, when the config sets one."""
        if config.admin_api_key is None:
            return
        if not hmac.compare_digest(admin_key_of(request).encode(), config.admin_api_key.encode()):
            raise HTTPException(401, "this needs the fleet's admin_api_key (Authorization: Bearer KEY)",
                                headers={"WWW-Authenticate": 'Basic realm="tokenmill fleet"'})

    def identify(request: Request) -> tuple[str, str] | JSONResponse:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        found = config.tenant_by_key(key) if key else None
        if found is None:
            return error(401, "missing or unknown API key (Authorization: Bearer KEY)", "authentication_error",
                         "invalid_api_key")
        tenant, t = found
        slo_class = request.headers.get(SLO_HEADER, t.slo_class)
        if slo_class not in config.slo_classes:
            return error(400, f"{SLO_HEADER}: {slo_class!r} is not one of {sorted(config.slo_classes)}",
                         "invalid_request_error", param=SLO_HEADER)
        return tenant, slo_class

    async def proxy(request: Request, path: str) -> Response:
        who = identify(request)
        if isinstance(who, JSONResponse):
            return who
        tenant, slo_class = who
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if model not in config.models():
            return error(404, f"model: {model!r} is not served here; models: {config.models()}",
                         "invalid_request_error", "model_not_found", "model")
        try:
            lease = await runtime.router.admit(model, slo_class)
        except Shed as e:
            runtime.metrics.shed.labels(tenant, slo_class, e.decision.reason.value).inc()
            if e.decision.reason == Reason.NO_POOL:
                return error(503, f"no healthy replica serves {model!r}", "server_error", "no_replica")
            return error(429, f"the fleet is at capacity for {slo_class!r} traffic ({e.decision.reason.value}); "
                         f"retry after {e.retry_after} s", "rate_limit_error", e.decision.reason.value,
                         headers={"Retry-After": str(e.retry_after)})
        request_id = request.headers.get("x-request-id") or f"fleet-{uuid.uuid4().hex[:16]}"
        headers = {**request.headers, "x-request-id": request_id}

        async def on_done(usage: Usage, status: str, e2e_s: float) -> None:
            await runtime.finish(lease, tenant, slo_class, request_id, usage, status, e2e_s)

        try:
            return await forward(runtime.client, lease, path, body, headers, on_done)
        except Exception:
            return error(502, f"replica {lease.replica.name} did not answer", "server_error", "bad_gateway")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request):
        who = identify(request)
        if isinstance(who, JSONResponse):
            return who
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "tokenmill"}
                                           for m in config.models()]}

    @app.get("/health")
    async def health():
        if not runtime.started:
            return Response("starting", 503)
        return Response("ok", 200)

    @app.get("/metrics", dependencies=[Depends(admin)])
    async def metrics():
        runtime.update_gauges()
        return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/dashboard", dependencies=[Depends(admin)])
    async def dashboard():
        return FileResponse(str(dashboard_dir() / "index.html"), media_type="text/html")

    @app.get("/dashboard/data", dependencies=[Depends(admin)])
    async def data():
        runtime.update_gauges()
        # off the event loop: the ledger query waits behind the ledger's pending writes
        return JSONResponse(await asyncio.to_thread(dashboard_data.snapshot, runtime))

    @app.get("/dashboard/{name}", dependencies=[Depends(admin)])
    async def static(name: str):
        if name not in DASHBOARD_FILES:
            return Response("not found", 404)
        kind = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[name.rsplit(".", 1)[1]]
        return FileResponse(str(dashboard_dir() / name), media_type=kind)

    return app
