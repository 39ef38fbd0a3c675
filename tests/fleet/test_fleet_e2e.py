"""The fleet live on loopback: two models in two pools, three tenants. Per-tenant totals on
/metrics match the requests sent; the device-seconds billed add up to the engines' busy seconds
(within 1%); the ledger keeps an earlier run's rows and appends this run's."""
from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenmill.fleet.replica import parse_engine_metrics


def series(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def engine_busy(fleet) -> float:
    urls = [r["url"] for p in fleet.data()["pools"] for r in p["replicas"]]
    return sum(parse_engine_metrics(httpx.get(u + "/metrics", timeout=10).text)["tokenmill:engine_busy_seconds_total"]
               for u in urls)


async def _traffic(fleet) -> dict[str, dict[str, int]]:
    """Concurrent requests from the three tenants; returns what each was told it used."""
    sent = {t: {"requests": 0, "prompt": 0, "completion": 0} for t in ("acme", "initech", "globex")}

    def add(tenant, usage):
        sent[tenant]["requests"] += 1
        sent[tenant]["prompt"] += usage.prompt_tokens
        sent[tenant]["completion"] += usage.completion_tokens

    def client(tenant):
        return openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key=fleet.key(tenant), max_retries=0)

    async def acme_chat(i):
        async with client("acme") as c:
            r = await c.chat.completions.create(model="default", max_tokens=6, temperature=0,
                                                messages=[{"role": "user", "content": f"Say {i}"}])
            add("acme", r.usage)

    async def acme_stream(i):
        async with client("acme") as c:
            stream = await c.completions.create(model="default", prompt=f"Count to {i}:", max_tokens=5,
                                                stream=True, stream_options={"include_usage": True})
            chunks = [ch async for ch in stream]
            assert chunks[-1].usage is not None and not chunks[-1].choices
            add("acme", chunks[-1].usage)

    async def initech(i):
        async with client("initech") as c:
            stream = await c.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=4, stream=True)
            chunks = [ch async for ch in stream]  # no usage asked for: the fleet drops the one it read
            assert all(not getattr(ch, "usage", None) for ch in chunks)
            assert chunks and chunks[-1].choices[0].finish_reason is not None
        sent["initech"]["requests"] += 1

    async def globex(i):
        async with client("globex") as c:
            r = await c.completions.create(model="tiny", prompt=f"batch job {i}", max_tokens=8)
            add("globex", r.usage)

    jobs = [acme_chat(i) for i in range(3)] + [acme_stream(i) for i in range(2)]
    jobs += [initech(i) for i in range(3)] + [globex(i) for i in range(6)]
    await asyncio.gather(*jobs)
    return sent


def _ledger_rows(fleet) -> tuple[int, dict[str, int], int]:
    with sqlite3.connect(f"file:{fleet.ledger}?mode=ro", uri=True) as conn:
        n = conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        tenants = dict(conn.execute("SELECT tenant, COUNT(*) FROM requests GROUP BY tenant").fetchall())
        pool_rows = conn.execute("SELECT COUNT(*) FROM pool_time").fetchone()[0]
    return n, tenants, pool_rows


class Delta:
    """/metrics now minus /metrics at construction (other tests may have used the fleet before)."""

    def __init__(self, fleet) -> None:
        self.fleet, self.before = fleet, fleet.metrics()

    def refresh(self) -> None:
        self.after = self.fleet.metrics()

    def __call__(self, name: str, **labels) -> float:
        return series(self.after, name, **labels) - series(self.before, name, **labels)


def test_per_tenant_totals_billing_and_ledger(fleet):
    busy_before = engine_busy(fleet)
    rows_before, tenants_before, _ = _ledger_rows(fleet)
    delta = Delta(fleet)
    sent = asyncio.run(_traffic(fleet))
    delta.refresh()
    for tenant, s in sent.items():
        assert delta("tokenmill:fleet_requests_total", tenant=tenant, status="ok") == s["requests"], tenant
    for tenant in ("acme", "globex"):
        assert delta("tokenmill:fleet_prompt_tokens_total", tenant=tenant) == sent[tenant]["prompt"]
        assert delta("tokenmill:fleet_generation_tokens_total", tenant=tenant) == sent[tenant]["completion"]
    # each model went to its own pool; the SLO class of each tenant is on its series
    assert delta("tokenmill:fleet_requests_total", pool="premium", tenant="acme", slo_class="interactive") == 5
    assert delta("tokenmill:fleet_requests_total", pool="economy", tenant="globex", slo_class="batch") == 6
    assert delta("tokenmill:fleet_routing_decisions_total", slo_class="batch", reason="idle_capacity") >= 1
    assert delta("tokenmill:fleet_routing_decisions_total", slo_class="interactive") == 5

    # billing: what the engines charged the requests is what they were busy
    billed = delta("tokenmill:fleet_device_seconds_total")
    busy = engine_busy(fleet) - busy_before
    assert busy > 0 and abs(billed - busy) <= 0.01 * busy, (billed, busy)
    cost = delta("tokenmill:fleet_cost_usd_total", pool="premium")
    premium_s = delta("tokenmill:fleet_device_seconds_total", pool="premium")
    assert cost == pytest.approx(premium_s * 4.0 / 3600)

    # the ledger: the earlier run's row is still there, and one row per request of this run follows
    expected = rows_before + sum(s["requests"] for s in sent.values())
    deadline = time.monotonic() + 10
    while True:
        n, tenants, pool_rows = _ledger_rows(fleet)
        if n >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    with sqlite3.connect(f"file:{fleet.ledger}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM requests WHERE request_id = 'earlier-1'").fetchone()[0] == 1
    assert n == expected
    assert {t: tenants.get(t, 0) - tenants_before.get(t, 0) for t in sent} == {"acme": 5, "initech": 3, "globex": 6}
    assert pool_rows >= 2  # wall and busy time per replica, written every second
    r = subprocess.run([sys.executable, "-m", "tokenmill", "ledger", "--ledger", str(fleet.ledger), "--by",
                        "tenant,slo_class"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert all(t in r.stdout for t in ("acme", "initech", "globex", "utilization", "idle_cost_usd"))


def test_errors_name_what_is_wrong(fleet):
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "default", "prompt": "x"},
                   headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "gpt-9", "prompt": "x"},
                   headers={"Authorization": f"Bearer {fleet.key('acme')}"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model" and "tiny" in r.json()["error"]["message"]
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {fleet.key('acme')}", "X-SLO-Class": "gold"})
    assert r.status_code == 400 and "x-slo-class" in r.json()["error"]["message"]
    # the header picks another class for this request
    r = httpx.post(fleet.url + "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {fleet.key('acme')}", "X-SLO-Class": "batch"})
    assert r.status_code == 200 and r.headers["x-tokenmill-route-reason"] == "idle_capacity"
    models = openai.OpenAI(base_url=fleet.url + "/v1", api_key=fleet.key("globex")).models.list()
    assert sorted(m.id for m in models.data) == ["default", "tiny"]


async def _abandon(fleet, tenant: str, model: str, i: int) -> None:
    """A client that reads two chunks of a long stream and leaves (closes the connection)."""
    async with openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key=fleet.key(tenant), max_retries=0) as c:
        stream = await c.completions.create(model=model, prompt=f"Write a long story about {i}:", max_tokens=400,
                                            stream=True, extra_body={"ignore_eos": True})
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.close()


def test_abandoned_streams_are_billed(fleet):
    """A client that disconnects mid-stream: its request is aborted on the engine and billed what the
    engine charged it (status `abandoned`), so billed device-seconds still equal the engines' busy
    seconds with aborts in the mix."""
    busy_before = engine_busy(fleet)
    delta = Delta(fleet)

    async def mix():
        async with openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key=fleet.key("acme"), max_retries=0) as c:
            done = [c.completions.create(model="default", prompt=f"Hi {i}", max_tokens=4) for i in range(2)]
            await asyncio.gather(*done, _abandon(fleet, "acme", "default", 1), _abandon(fleet, "initech", "default", 2))

    asyncio.run(mix())
    deadline = time.monotonic() + 30
    while True:  # the abandoned ones are billed in the background, once their replica answers
        delta.refresh()
        if delta("tokenmill:fleet_requests_total", status="abandoned") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta("tokenmill:fleet_requests_total", status="abandoned") == 2
    assert delta("tokenmill:fleet_requests_total", status="ok") == 2
    assert delta("tokenmill:fleet_device_seconds_total", tenant="initech") > 0
    billed = delta("tokenmill:fleet_device_seconds_total")
    busy = engine_busy(fleet) - busy_before
    assert busy > 0 and abs(billed - busy) <= 0.01 * busy, (billed, busy)
    with sqlite3.connect(f"file:{fleet.ledger}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT tenant, prompt_tokens, completion_tokens, "
                            "prefill_device_seconds + decode_device_seconds, cost_usd FROM requests "
                            "WHERE status = 'abandoned'").fetchall()
    assert sorted(r[0] for r in rows) == ["acme", "initech"]
    for _, prompt, completion, device_s, cost in rows:
        # it was stopped: far fewer than the 400 tokens asked for, yet it used the device
        assert prompt > 0 and 2 <= completion < 400 and device_s > 0 and cost > 0
