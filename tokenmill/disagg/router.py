"""The disaggregating router: the OpenAI API in front of prefill, decode and colocated engines.

For each completions / chat request: tokenize it (an engine's /tokenize), hash its blocks as the
engines do, let `policy.plan_route` pick the decode instance and decide whether to prefill
elsewhere; if so, send the prefill engine the request with max_tokens 1 and
{"do_remote_decode": true}, then the decode engine the original request with the hand-over the
prefill engine returned. Streams pass through byte for byte.

Failures never hang a client: a prefill engine that fails or times out makes the decode engine
prefill itself (counted); a decode engine that cannot be reached is marked down and the request
goes to the next one; one that dies mid-stream ends the stream with an OpenAI error event and
[DONE] (or a 502 body). Every upstream call has a timeout.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tokenmill.disagg.instances import InstanceMonitor
from tokenmill.disagg.load_window import LoadWindow
from tokenmill.disagg.planner import Decision, Planner, PlannerConfig, pick_mover
from tokenmill.disagg.policy import InstanceState, RouterConfig, plan_route, prompt_block_hashes
from tokenmill.disagg.role_profile import RoleProfile
from tokenmill.disagg.sla_planner import ProfilePlanner, SLAPlannerConfig

logger = logging.getLogger("tokenmill.router")


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "server_error" if status >= 500 else
                                   "invalid_request_error", "param": None, "code": code}}, status_code=status)


class Router:
    def __init__(self, prefill: list[str], decode: list[str], both: list[str], cfg: RouterConfig,
                 poll_interval_s: float = 0.2, request_timeout_s: float = 600.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not decode and not both:
            raise ValueError("the router needs at least one --decode or --both instance")
        self.cfg = cfg
        self.prefills = [InstanceState(u.rstrip("/"), "prefill") for u in prefill]
        self.decodes = [InstanceState(u.rstrip("/"), "decode") for u in decode] + \
                       [InstanceState(u.rstrip("/"), "both") for u in both]
        self.timeout = httpx.Timeout(request_timeout_s, connect=5.0)
        self.client = httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(max_connections=1024),
                                        transport=transport)  # transport: tests only
        self.monitor = InstanceMonitor(self.prefills + self.decodes, self.client, poll_interval_s)
        self.registry = CollectorRegistry()
        self.routed = Counter("tokenmill:router_requests", "Requests routed, by path (disaggregated: prefilled on "
                              "a prefill instance; local: prefilled by the decode instance).", ["path"],
                              registry=self.registry)
        self.failovers = Counter("tokenmill:router_prefill_failovers", "Prefill calls that failed: the decode "
                                 "instance prefilled instead.", registry=self.registry)
        self.retries = Counter("tokenmill:router_decode_retries", "Decode instances that could not be reached "
                               "(the request went to another).", registry=self.registry)
        self.errors = Counter("tokenmill:router_errors", "Requests that ended in an error from the router.",
                              registry=self.registry)
        self.planner: Planner | ProfilePlanner | None = None
        self.window = LoadWindow()  # this planner interval's requests, for the profile planner
        self.role_changes = Counter("tokenmill:planner_role_changes", "Instances the planner moved, by new role.",
                                    ["to"], registry=self.registry)
        self.pool_size = Gauge("tokenmill:planner_instances", "Instances per pool.", ["role"], registry=self.registry)
        self.pressure = Gauge("tokenmill:planner_pressure", "The planner's signal per pool at its last decision "
                              "(queue planner: mean requests waiting per instance; profile planner: engines the "
                              "predicted load needs).", ["role"], registry=self.registry)
        self.correction = Gauge("tokenmill:planner_correction", "Profile planner: measured / profiled latency "
                                "(prefill: TTFT, decode: ITL) at its last decision.", ["role"], registry=self.registry)
        self.decisions: list[dict] = []  # the planner's moves (bounded), for /router/planner
        self.last_decision: str | None = None  # the latest decision's reason, moved or not

    def enable_planner(self, cfg: PlannerConfig | SLAPlannerConfig, profile: RoleProfile | None = None) -> None:
        """`PlannerConfig`: the queue-pressure planner; `SLAPlannerConfig` + `profile`: the profile-driven one."""
        if isinstance(cfg, SLAPlannerConfig):
            if profile is None:
                raise ValueError("the profile planner needs a role profile")
            self.planner = ProfilePlanner(cfg, profile)
        else:
            self.planner = Planner(cfg)

    def plan(self) -> Decision | None:
        """One planner interval: decide, move at most one instance, log and export why."""
        if self.planner is None:
            return None
        load = self.window.close(self.prefills + self.decodes, self.decodes)
        d = self.planner.step(self.prefills, self.decodes, load)
        self.last_decision = d.reason
        self.pressure.labels("prefill").set(d.prefill_pressure)
        self.pressure.labels("decode").set(d.decode_pressure)
        if isinstance(self.planner, ProfilePlanner):
            self.correction.labels("prefill").set(self.planner.corrections.prefill)
            self.correction.labels("decode").set(self.planner.corrections.decode)
        if d.move:
            src, dst, role = ((self.decodes, self.prefills, "prefill") if d.move > 0 else
                              (self.prefills, self.decodes, "decode"))
            queues = {"prefill": [i.queue for i in self.prefills], "decode": [i.queue for i in self.decodes]}
            inst = src.pop(pick_mover(src))
            inst.role = role
            dst.append(inst)
            self.role_changes.labels(role).inc()
            self.decisions = (self.decisions + [{"instance": inst.url, "to": role, "reason": d.reason,
                                                 "queues": queues, "time": time.time()}])[-100:]
            logger.info("planner: %s becomes %s: %s; queues before: %s", inst.url, role, d.reason, queues)
        self.pool_size.labels("prefill").set(len(self.prefills))
        self.pool_size.labels("decode").set(len(self.decodes))
        return d

    # -- request path ---------------------------------------------------------------------------
    async def handle(self, path: str, body: dict[str, Any]) -> Response:
        tokens = await self._tokens(path, body)
        bs, key = self.monitor.block_size or 16, self.monitor.hash_key or ""
        hashes = prompt_block_hashes(tokens, bs, key) if tokens is not None and key else []
        exclude: set[int] = set()
        transfer: dict | None = None
        tried_prefill = False
        t0 = time.monotonic()
        while True:
            decision = plan_route(len(tokens or []), hashes, bs, self.decodes, self.prefills, self.cfg, exclude)
            if decision is None:
                self.errors.inc()
                return _error(503, "no decode instance is reachable", "no_instance")
            if not exclude:  # once per request: what a hand-over could take, whichever pool exists now
                n = len(tokens or [])
                self.window.record_request(n, tokens is not None and _single(body) and
                                           n - decision.overlap_tokens >= self.cfg.min_remote_prefill_tokens)
            dec = self.decodes[decision.decode]
            if decision.prefill is not None and tokens is not None and _single(body) and not tried_prefill:
                tried_prefill = True
                transfer = await self._prefill(self.prefills[decision.prefill], path, body)
            self.routed.labels("disaggregated" if transfer else "local").inc()
            out = dict(body)
            if transfer:
                out["kv_transfer_params"] = transfer
            try:
                return await self._decode(dec, path, out, (t0, len(tokens or [])))
            except httpx.TransportError as e:  # not reached, or closed before answering: try the next one
                logger.warning("decode instance %s failed before answering (%r): trying another", dec.url, e)
                self.monitor.mark_down(dec)
                self.retries.inc()
                exclude.add(decision.decode)

    async def _tokens(self, path: str, body: dict) -> list[int] | None:
        """The prompt's token ids (one prompt only), from any reachable engine's /tokenize."""
        if path.endswith("/chat/completions"):
            req = {k: body[k] for k in ("messages", "tools", "chat_template_kwargs", "add_generation_prompt")
                   if k in body}
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return list(prompt)
            if not isinstance(prompt, str):
                return None
            req = {"prompt": prompt}
        for inst in [d for d in self.decodes if d.healthy] + [p for p in self.prefills if p.healthy]:
            try:
                r = await self.client.post(f"{inst.url}/tokenize", json=req, timeout=10.0)
            except httpx.HTTPError:
                continue
            return r.json().get("tokens") if r.status_code == 200 else None
        return None

    async def _prefill(self, inst: InstanceState, path: str, body: dict) -> dict | None:
        req = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
        req.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        inst.in_flight += 1
        try:
            r = await self.client.post(f"{inst.url}{path}", json=req)
            params = r.json().get("kv_transfer_params") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            logger.warning("prefill instance %s failed (%r): the decode instance prefills", inst.url, e)
            if isinstance(e, httpx.TransportError):
                self.monitor.mark_down(inst)
            params = None
        finally:
            inst.in_flight -= 1
        if params is None:
            self.failovers.inc()
        return params

    async def _decode(self, inst: InstanceState, path: str, body: dict, since: tuple[float, int]) -> Response:
        """`since`: when the request arrived and its prompt tokens (a stream's TTFT, for the planner)."""
        url = f"{inst.url}{path}"
        if not body.get("stream"):
            inst.in_flight += 1
            try:
                r = await self.client.post(url, json=body)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout) as e:
                self.errors.inc()
                self.monitor.mark_down(inst)
                return _error(502, f"the decode instance failed while answering: {e!r}", "upstream_failed")
            finally:
                inst.in_flight -= 1
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        req = self.client.build_request("POST", url, json=body)
        inst.in_flight += 1
        try:
            upstream = await self.client.send(req, stream=True)
        except BaseException:
            inst.in_flight -= 1
            raise
        return StreamingResponse(self._relay(inst, upstream, since), status_code=upstream.status_code,
                                 media_type=upstream.headers.get("content-type", "text/event-stream"))

    async def _relay(self, inst: InstanceState, upstream: httpx.Response,
                     since: tuple[float, int]) -> AsyncIterator[bytes]:
        first = upstream.status_code == 200
        try:
            async for chunk in upstream.aiter_raw():
                if first and (b'"role"' not in chunk or chunk.count(b"data:") > 1):  # past chat's role-only
                    self.window.record_ttft(since[1], time.monotonic() - since[0])  # chunk: the first token
                    first = False
                yield chunk
        except httpx.HTTPError as e:
            self.errors.inc()
            self.monitor.mark_down(inst)
            logger.warning("decode instance %s failed mid-stream (%r)", inst.url, e)
            body = {"error": {"message": f"the decode instance failed mid-stream: {e!r}", "type": "server_error",
                              "param": None, "code": "upstream_failed"}}
            yield f"\n\ndata: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
        finally:
            inst.in_flight -= 1
            await upstream.aclose()


async def _plan_forever(router: Router) -> None:
    while True:
        await asyncio.sleep(router.planner.cfg.interval_s)
        try:
            router.plan()
        except Exception:  # a planner bug must not stop routing
            logger.exception("planner step failed")


def _single(body: dict) -> bool:
    """One prompt, one sample, no logprobs: what a hand-over can serve."""
    return (body.get("n", 1) == 1 and not body.get("echo") and body.get("prompt_logprobs") is None
            and body.get("logprobs") in (None, False))  # the first token's logprobs would stay on the prefill side


def build_router_app(router: Router) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await router.monitor.refresh()
        router.monitor.start()
        planner = asyncio.create_task(_plan_forever(router)) if router.planner is not None else None
        try:
            yield
        finally:
            if planner is not None:
                planner.cancel()
            await router.monitor.stop()
            await router.client.aclose()

    app = FastAPI(title="tokenmill router", lifespan=lifespan)

    async def forward(request: Request, path: str) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the body is not valid JSON", "invalid_json")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_json")
        return await router.handle(path, body)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await forward(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models():
        for inst in router.decodes:
            if inst.healthy:
                with contextlib.suppress(httpx.HTTPError):
                    r = await router.client.get(f"{inst.url}/v1/models", timeout=5.0)
                    return Response(r.content, status_code=r.status_code, media_type="application/json")
        return _error(503, "no decode instance is reachable", "no_instance")

    @app.get("/health")
    async def health():
        ok = any(d.healthy for d in router.decodes)
        return JSONResponse({"status": "ok" if ok else "no decode instance"}, status_code=200 if ok else 503)

    @app.get("/router/state")
    async def state():
        return [{"url": i.url, "role": i.role, "healthy": i.healthy, "queue": i.queue, "kv_usage": i.kv_usage,
                 "cached_blocks": len(i.cached)} for i in router.prefills + router.decodes]

    @app.get("/router/planner")
    async def planner_log():
        return {"enabled": router.planner is not None, "moves": router.decisions, "last": router.last_decision,
                "pools": {"prefill": [i.url for i in router.prefills], "decode": [i.url for i in router.decodes]}}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(router.registry), media_type=CONTENT_TYPE_LATEST)

    return app
