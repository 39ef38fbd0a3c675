"""Fault injection: a request that fails inside the model step (the test-only
TOKENMILL_TEST_FAULT_TOKEN hook) gets a 500 naming it, while the requests batched with it finish
with the text they would have had anyway, and no KV block or request-table entry is left behind."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from e2e_helpers import InProcessServer

from tokenmill.server.app import build_app
from tokenmill.worker.model_runner import FAULT_TOKEN_ENV

FAULT_TOKEN = 510  # in the tiny model's vocabulary, never produced by its tokenizer from text
GOOD = [{"prompt": [5 + i, 40 + i, 7, 99], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        for i in range(6)]
BAD = {"prompt": [5, FAULT_TOKEN, 7], "max_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def faulty(make_engine):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULT_TOKEN_ENV, str(FAULT_TOKEN))
        engine = make_engine()
    with InProcessServer(build_app(engine, max_waiting_requests=64)) as srv:
        yield srv, engine


async def _stream_text(c: httpx.AsyncClient, body: dict) -> tuple[str, dict | None]:
    text, error = "", None
    async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]
                else:
                    text += chunk["choices"][0]["text"]
    return text, error


def test_a_failing_request_does_not_take_the_others_down(faulty):
    srv, engine = faulty
    reference = [httpx.post(srv.url + "/v1/completions", json=b, timeout=60).json()["choices"][0]["text"]
                 for b in GOOD]

    async def main():
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            good = [asyncio.ensure_future(_stream_text(c, b) if i % 2 else c.post("/v1/completions", json=b))
                    for i, b in enumerate(GOOD)]
            bad_plain = c.post("/v1/completions", json=BAD)
            bad_stream = _stream_text(c, BAD)
            return await asyncio.gather(*good, bad_plain, bad_stream)

    *good, bad_plain, bad_stream = asyncio.run(main())
    texts = [g[0] if isinstance(g, tuple) else g.json()["choices"][0]["text"] for g in good]
    assert texts == reference  # greedy: the same text as when each ran alone
    assert bad_plain.status_code == 500
    err = bad_plain.json()["error"]
    assert err["code"] == "request_failed" and err["type"] == "server_error"
    assert "request cmpl-" in err["message"] and "Traceback" not in bad_plain.text
    assert bad_stream[1] is not None and bad_stream[1]["code"] == "request_failed"
    # nothing leaked, and the server still serves
    assert httpx.get(srv.url + "/health").status_code == 200
    assert not engine.has_unfinished_requests() and not engine.core.scheduler.requests
    assert engine.core.kv.pool.num_used_blocks == 0
    ok = httpx.post(srv.url + "/v1/completions", json=GOOD[0], timeout=60)
    assert ok.json()["choices"][0]["text"] == reference[0]
    # the runner was told to forget the failed ones in the step after
    assert all(FAULT_TOKEN not in r.prompt_token_ids for r in engine.runner.requests.values())
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'finished_reason="error"' in metrics


def _wait_health(url: str, status: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout  # a safety net only: a restart reloads the model
    while True:
        r = httpx.get(url + "/health")
        if r.status_code == status:
            return r.json()
        assert time.monotonic() < deadline, r.text
        time.sleep(0.02)


def test_a_dead_engine_loop_is_restarted(make_engine):
    """The loop dies (an exception no request owns): in-flight requests end with engine_dead at
    once, /health says 503 while a fresh engine is built, then serves again; after the last
    allowed restart it stays 503."""
    engine = make_engine()
    with InProcessServer(build_app(engine, max_engine_restarts=1)) as srv:
        state = srv.app.state.tokenmill

        def die():
            raise RuntimeError("simulated device failure")
        engine.step = die
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        _wait_health(srv.url, 200)
        print(f"\nengine restart: healthy again {time.monotonic() - t0:.2f} s after the loop died")
        assert state.num_engine_restarts == 1 and state.engine.engine is not engine
        ok = httpx.post(srv.url + "/v1/completions", json=GOOD[0], timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 12
        state.engine.engine.step = die  # the second death: no restart left
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=30)
        assert r.status_code == 503
        body = _wait_health(srv.url, 503)
        assert body["status"] == "error" and state.num_engine_restarts == 1
