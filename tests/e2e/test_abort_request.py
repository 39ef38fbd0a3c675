"""POST /abort_request: a stream's client names its request by X-Request-Id; the server aborts it
in the engine and answers what it used (tokens so far, the device-seconds it was charged), which is
how a fleet bills a request whose client left. The stream itself ends; an unknown id answers found:
false with zero usage."""
from __future__ import annotations

import json

import httpx
import pytest
from e2e_helpers import InProcessServer

from tokenmill.engine.async_engine import STEP_DELAY_ENV
from tokenmill.server.app import build_app


@pytest.fixture()
def server(make_engine, monkeypatch):
    monkeypatch.setenv(STEP_DELAY_ENV, "0.02")  # the stream lasts for seconds on any machine
    with InProcessServer(build_app(make_engine())) as srv:
        yield srv


def test_abort_by_request_id_answers_the_usage_so_far(server):
    body = {"prompt": "The quick brown fox", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/completions", json=body, headers={"X-Request-Id": "job-7"}) as r:
            chunks, a, rest = 0, None, []
            for line in r.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                    chunks += 1
                if chunks == 3 and a is None:
                    a = c.post(server.url + "/abort_request", json={"request_id": "job-7"})
                    assert a.status_code == 200, a.text
                elif a is not None:
                    rest.append(line)  # the stream ends (with an error event) instead of running on
        got = a.json()
        assert got["found"] and got["aborted"] and got["complete"]
        u = got["usage"]
        assert u["prompt_tokens"] > 0 and 3 <= u["completion_tokens"] < 400
        assert u["tokenmill"]["prefill_device_seconds"] > 0 and u["tokenmill"]["decode_device_seconds"] > 0
        assert "data: [DONE]" in rest and len(rest) < 50
        # asking again answers the same (the usage is kept), and an unknown id is not an error
        assert c.post(server.url + "/abort_request", json={"request_id": "job-7"}).json()["usage"] == u
        none = c.post(server.url + "/abort_request", json={"request_id": "nope"}).json()
        assert not none["found"] and none["usage"]["completion_tokens"] == 0
        assert c.post(server.url + "/abort_request", json=["x"]).status_code == 400
