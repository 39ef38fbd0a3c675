"""Security defaults and flags, on in-process servers over the tiny model: loopback bind, the API key
on every route but /health (and /metrics only with --public-metrics), header and body caps, error
bodies without internals, CORS off unless --allowed-origins, prompts out of the log."""
from __future__ import annotations

import logging

import httpx
import pytest
from e2e_helpers import InProcessServer

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.server import cli_args
from tokenmill.server.app import build_app

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example.com"
MARKER = "zebra-quartz-marker"  # a prompt word that must never reach the log without --log-prompts


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.fixture(scope="module")
def keyed(make_engine):
    """--api-key, --allowed-origins ORIGIN, a 2 KiB header cap."""
    app = build_app(make_engine(), api_key=KEY, allowed_origins=[ORIGIN], max_request_header_bytes=2048)
    with InProcessServer(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server(make_engine):
    """No key, no CORS (the defaults)."""
    with InProcessServer(build_app(make_engine())) as srv:
        yield srv


def test_parser_defaults_are_safe(monkeypatch):
    monkeypatch.delenv(cli_args.API_KEY_ENV, raising=False)
    args = cli_args.make_parser().parse_args([])
    assert args.host == "127.0.0.1" and args.api_key is None and args.allowed_origins is None
    assert not args.public_metrics and not args.log_prompts
    assert args.max_request_header_bytes == cli_args.DEFAULT_MAX_REQUEST_HEADER_BYTES
    monkeypatch.setenv(cli_args.API_KEY_ENV, "from-env")
    assert cli_args.make_parser().parse_args([]).api_key == "from-env"
    assert cli_args.make_parser().parse_args(["--api-key", "flag"]).api_key == "flag"


def test_every_route_but_health_needs_the_key(keyed):
    """/health and /ping (the same probe) are open; everything else asks for the key."""
    model = httpx.get(keyed.url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
    routes = {(m, r.path.replace("{model:path}", model)) for r in keyed.app.routes for m in getattr(r, "methods", ())
              if m != "HEAD"}
    assert ("POST", "/v1/completions") in routes and ("GET", "/openapi.json") in routes
    bodies = {"/v1/completions": {"prompt": "hi", "max_tokens": 1}, "/v1/chat/completions": {"messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 1}, "/tokenize": {"prompt": "hi"},
        "/detokenize": {"tokens": [5]}, "/abort_request": {"request_id": "not-a-recent-one"}}
    for method, path in sorted(routes):
        kw = {"json": bodies.get(path, {})} if method == "POST" else {}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Bearer {KEY}x"}):
            r = httpx.request(method, keyed.url + path, headers=headers, **kw)
            if path in ("/health", "/ping"):
                assert r.status_code == 200
                continue
            assert _error(r, 401)["code"] == "invalid_api_key", (method, path)
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.request(method, keyed.url + path, headers=AUTH, **kw)
        assert r.status_code == 200, (method, path, r.text)
    _error(httpx.get(keyed.url + "/v1/nowhere"), 401)  # an unknown route tells a stranger nothing either
    _error(httpx.get(keyed.url + "/v1/nowhere", headers=AUTH), 404)


def test_public_metrics_flag(make_engine):
    with InProcessServer(build_app(make_engine(), api_key=KEY, public_metrics=True)) as srv:
        assert httpx.get(srv.url + "/metrics").status_code == 200
        _error(httpx.get(srv.url + "/v1/models"), 401)


def test_header_and_body_caps(keyed):
    r = httpx.get(keyed.url + "/v1/models", headers={**AUTH, "X-Filler": "a" * 4000})
    assert _error(r, 431)["code"] == "request_header_fields_too_large"
    r = httpx.get(keyed.url + "/v1/models", headers={**AUTH, **{f"X-H{i}": "b" * 100 for i in range(30)}})
    _error(r, 431)
    assert httpx.get(keyed.url + "/v1/models", headers={**AUTH, "X-Filler": "a" * 500}).status_code == 200
    r = httpx.get(keyed.url + "/health", headers={"X-Request-Id": "r" * 1000})
    assert r.status_code == 200 and len(r.headers["x-request-id"]) <= 128  # never echoes a blob back


def test_cors_only_for_allowed_origins(keyed, open_server):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization,content-type"}
    r = httpx.options(keyed.url + "/v1/completions", headers=pre)  # a preflight carries no credentials
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.options(keyed.url + "/v1/completions", headers={**pre, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(keyed.url + "/v1/models", headers={**AUTH, "Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    # default: no CORS headers at all
    r = httpx.get(open_server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = httpx.options(open_server.url + "/v1/completions", headers=pre)
    assert "access-control-allow-origin" not in r.headers


def test_error_bodies_hold_no_internals(make_engine, monkeypatch):
    """An unexpected exception whose message holds a file path: the 500 names the exception type
    only, never its message or a traceback; the same for a dead engine loop (503) and /health."""
    engine = make_engine()
    aengine = AsyncLLMEngine(engine, start=False)
    with InProcessServer(build_app(aengine, max_engine_restarts=0)) as srv:
        state = srv.app.state.tokenmill

        async def boom(*a, **k):
            raise RuntimeError("open('/home/secret/weights.bin') failed")
        monkeypatch.setattr(state.tokenization, "tokenize", boom)
        r = httpx.post(srv.url + "/tokenize", json={"prompt": "hi"})
        err = _error(r, 500)
        assert "RuntimeError" in err["message"] and "/home/secret" not in r.text and "Traceback" not in r.text

        def dead_step():
            raise OSError("/home/secret/device: I/O error")
        engine.step = dead_step
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
        assert _error(r, 503)["code"] == "engine_dead" and "/home/secret" not in r.text
        for r in (httpx.get(srv.url + "/health"), httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"})):
            assert r.status_code == 503 and "/home/secret" not in r.text and "OSError" in r.text


@pytest.mark.parametrize("log_prompts", [False, True])
def test_prompts_reach_the_log_only_with_log_prompts(make_engine, caplog, log_prompts, monkeypatch):
    # tokenmill's and uvicorn's loggers do not propagate to the root: listen to them directly
    for name in ("tokenmill", "uvicorn", "uvicorn.error", "uvicorn.access"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.DEBUG)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [*logging.getLogger(name).handlers, caplog.handler])
    caplog.set_level(logging.DEBUG)
    with InProcessServer(build_app(make_engine(), log_prompts=log_prompts)) as srv:
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": f"say {MARKER}", "max_tokens": 2})
        assert ok.status_code == 200
        chat = {"messages": [{"role": "user", "content": MARKER}], "max_tokens": 2}
        assert httpx.post(srv.url + "/v1/chat/completions", json=chat).status_code == 200
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": MARKER, "temperature": -3})
        assert r.status_code == 400 and MARKER not in r.text
    assert any(r.name.startswith("tokenmill") for r in caplog.records)  # the log was heard
    assert (MARKER in caplog.text) == log_prompts
