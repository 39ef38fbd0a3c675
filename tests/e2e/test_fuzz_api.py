"""Fuzzing the HTTP API: schemathesis over our OpenAPI document (every route, valid and invalid
inputs, with and without the API key), and a hypothesis property over request bodies: every
combination of sampling fields either runs (200) or is a 400 naming a field it set. Never a 5xx,
and every error is an OpenAI error body. Example counts are bounded and derandomized (CI)."""
from __future__ import annotations

import json
import math
import os

import httpx
import pytest
import schemathesis
from e2e_helpers import InProcessServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tokenmill.server.app import build_app

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# per operation and generation mode; TOKENMILL_FUZZ_EXAMPLES=500 for a deep run (docs/RELIABILITY.md)
EXAMPLES = int(os.environ.get("TOKENMILL_FUZZ_EXAMPLES") or 10)


def bounded(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_server(make_engine):
    """A short context (64 tokens) so that any valid request finishes quickly; a chat template."""
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    app = build_app(make_engine(max_model_len=64), api_key=KEY, served_model_names=["tiny"],
                    chat_template=template)
    with InProcessServer(app) as srv:
        yield srv


def _check_error_body(status: int, text: str, where: str) -> dict:
    assert status < 500, f"{where}: {status} {text[:500]}"
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"}, where
    assert isinstance(err["message"], str) and err["message"], where
    assert err["code"] is None or isinstance(err["code"], str), where
    assert "Traceback" not in text and "/work/" not in text and ".py" not in text, where
    return err


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no-key"])
def test_schemathesis_every_route(fuzz_server, with_key):
    schema = schemathesis.openapi.from_dict(fuzz_server.app.openapi())
    headers = AUTH if with_key else {}
    seen: dict[str, set[int]] = {}
    counts: dict[int, int] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        # a GET without parameters has no invalid form to generate
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.method.upper() == "POST" else [])
        for mode in modes:
            @bounded(EXAMPLES)
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                r = case.call(base_url=fuzz_server.url, headers={**(case.headers or {}), **headers}, timeout=60)
                where = f"{op.label} [{mode.value}] body={str(case.body)[:300]!r}"
                seen.setdefault(op.label, set()).add(r.status_code)
                counts[r.status_code] = counts.get(r.status_code, 0) + 1
                if r.status_code >= 400:
                    _check_error_body(r.status_code, r.text, where)
                if not with_key and op.path not in ("/health", "/ping"):
                    assert r.status_code == 401, where

            run()
    print(f"\nschemathesis ({'key' if with_key else 'no key'}): {sum(counts.values())} requests, by status "
          f"{dict(sorted(counts.items()))}")  # the figures of docs/RELIABILITY.md (pytest -s)
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /health", "GET /metrics"} <= seen.keys()
    if with_key:  # the fuzzer got past validation at least once on the generating routes
        assert 200 in seen["POST /v1/completions"] | seen["POST /v1/chat/completions"], seen
    assert httpx.get(fuzz_server.url + "/health").status_code == 200


# -- a property over request bodies --------------------------------------------------------------
_NUM = st.one_of(st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False),
                 st.sampled_from([0, 1, -1, 0.5, 2, 100, 101, 1e-9]))
FIELDS = {
    "n": st.one_of(st.integers(-2, 140), _NUM),
    "temperature": _NUM, "top_p": _NUM, "top_k": st.one_of(st.integers(-3, 600), _NUM), "min_p": _NUM,
    "presence_penalty": _NUM, "frequency_penalty": _NUM, "repetition_penalty": _NUM,
    "seed": st.one_of(st.integers(-5, 2**64 + 5), st.none()),
    "max_tokens": st.one_of(st.integers(-2, 80), st.none(), _NUM),
    "min_tokens": st.one_of(st.integers(-2, 80), _NUM),
    "logprobs": st.one_of(st.integers(-2, 25), st.none()),
    "stop": st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stop_token_ids": st.one_of(st.none(), st.lists(st.integers(-3, 600), max_size=3)),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
}


def _field_body(data) -> dict:
    chosen = data.draw(st.sets(st.sampled_from(sorted(FIELDS)), max_size=6))
    return {name: data.draw(FIELDS[name]) for name in sorted(chosen)}


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_every_sampling_combination_runs_or_names_its_field(fuzz_server, endpoint):
    counts: dict[int, int] = {}

    @bounded(3 * EXAMPLES)
    @given(data=st.data())
    def run(data):
        body = _field_body(data)
        if endpoint == "/v1/completions":
            body["prompt"] = data.draw(st.one_of(st.just("Hello"), st.lists(st.integers(0, 511), min_size=1,
                                                                             max_size=4)))
        else:
            body["messages"] = [{"role": "user", "content": "Hello"}]
            if "logprobs" in body:
                body["top_logprobs"] = body.pop("logprobs")
                body["logprobs"] = body["top_logprobs"] is not None
        r = httpx.post(fuzz_server.url + endpoint, content=json.dumps(body), headers=AUTH, timeout=60)
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        if r.status_code == 200:
            if body.get("stream"):
                assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text[-300:]
            return
        err = _check_error_body(r.status_code, r.text, f"{endpoint} {body}")
        assert r.status_code == 400, (body, r.text)
        assert err["param"] in body, (body, err)  # the field at fault, and one the client sent

    run()
    print(f"\nsampling property {endpoint}: {sum(counts.values())} requests, by status {dict(sorted(counts.items()))}")


@given(st.fixed_dictionaries({}, optional={k: v for k, v in FIELDS.items() if k not in ("stream",)}))
@bounded(15 * EXAMPLES)
def test_sampling_params_accept_or_name_the_field(kwargs):
    """SamplingParams alone: constructs, or raises ValueError whose message starts with a field
    it was given (the server maps that word to `param`)."""
    from tokenmill.sampling_params import SamplingParams
    from tokenmill.server.errors import param_of
    try:
        p = SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        assert param_of(str(e)) in kwargs, (kwargs, str(e))
        return
    for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
        assert math.isfinite(getattr(p, name)), (name, kwargs)
