"""The router's request path against fake engines (httpx.MockTransport): where each request goes,
what the prefill call carries, and the failovers."""
from __future__ import annotations

import asyncio
import json

import httpx

from tokenmill.disagg.policy import RouterConfig
from tokenmill.disagg.router import Router

P, D1, D2 = "http://p", "http://d1", "http://d2"


class FakeEngines:
    def __init__(self, down: set[str] = frozenset(), prefill_status: int = 200,
                 dies: set[str] = frozenset()) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.down, self.prefill_status, self.dies = set(down), prefill_status, set(dies)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}"
        if base in self.down:
            raise httpx.ConnectError("refused", request=request)
        path = request.url.path
        if path == "/metrics":
            return httpx.Response(200, text="")
        if path == "/v1/kv/events":
            return httpx.Response(200, json={"seq": 1, "reset": True, "stored": [], "removed": [], "block_size": 16,
                                             "hash_key": "k", "role": "x"})
        body = json.loads(request.content)
        self.calls.append((base + path, body))
        if base in self.dies and path == "/v1/completions":  # seen healthy by the monitor, gone now
            raise httpx.ConnectError("refused", request=request)
        if path == "/tokenize":
            return httpx.Response(200, json={"tokens": list(range(len(body["prompt"].split())))})
        if base == P:
            return httpx.Response(self.prefill_status, json={"kv_transfer_params": {"do_remote_prefill": True,
                                                                                      "transfer_id": 1}})
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "served_by": base})


def route(engines: FakeEngines, prompt: str, decodes=(D1,)) -> httpx.Response:
    async def go():
        router = Router([P], list(decodes), [], RouterConfig(min_remote_prefill_tokens=100),
                        transport=httpx.MockTransport(engines))
        await router.monitor.refresh()
        try:
            return await router.handle("/v1/completions", {"prompt": prompt, "max_tokens": 5}), router
        finally:
            await router.client.aclose()
    return asyncio.run(go())


def test_short_prompt_stays_on_the_decode_engine():
    engines = FakeEngines()
    resp, router = route(engines, "word " * 50)
    assert [u for u, _ in engines.calls] == [D1 + "/tokenize", D1 + "/v1/completions"]
    assert "kv_transfer_params" not in engines.calls[-1][1] and resp.status_code == 200


def test_long_prompt_is_prefilled_elsewhere_and_handed_over():
    engines = FakeEngines()
    route(engines, "word " * 300)
    (u1, pre), (u2, dec) = engines.calls[1], engines.calls[2]
    assert u1 == P + "/v1/completions" and pre["max_tokens"] == 1 and pre["stream"] is False
    assert pre["kv_transfer_params"] == {"do_remote_decode": True}
    assert u2 == D1 + "/v1/completions" and dec["kv_transfer_params"]["transfer_id"] == 1 and dec["max_tokens"] == 5


def test_failed_prefill_falls_back_to_local():
    engines = FakeEngines(prefill_status=500)
    resp, router = route(engines, "word " * 300)
    assert "kv_transfer_params" not in engines.calls[-1][1] and resp.status_code == 200
    assert router.failovers._value.get() == 1


def test_unreachable_decode_engine_is_skipped():
    engines = FakeEngines(down={D1})  # the monitor saw it down: never tried
    resp, router = route(engines, "word " * 50, decodes=(D1, D2))
    assert json.loads(resp.body)["served_by"] == D2 and D1 + "/v1/completions" not in [u for u, _ in engines.calls]


def test_decode_engine_gone_since_the_last_scrape_is_retried_elsewhere():
    engines = FakeEngines(dies={D1})
    resp, router = route(engines, "word " * 50, decodes=(D1, D2))
    assert [u for u, _ in engines.calls if u.endswith("/completions")] == [D1 + "/v1/completions",
                                                                            D2 + "/v1/completions"]
    assert json.loads(resp.body)["served_by"] == D2 and router.retries._value.get() == 1


def test_no_decode_engine_is_a_503():
    resp, _ = route(FakeEngines(down={D1, P}), "word " * 50)
    assert resp.status_code == 503 and json.loads(resp.body)["error"]["code"] == "no_instance"
