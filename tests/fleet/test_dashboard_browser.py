"""The dashboard in a real headless browser (Debian's chromium driven by Playwright): the page
loads without console errors, its charts draw bars with data after traffic, and the numbers it
shows match /metrics."""
from __future__ import annotations

import shutil
import time

import httpx
import pytest

from test_fleet_e2e import series

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    if CHROMIUM is None:
        pytest.skip("no chromium (apt-get install chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _send(fleet) -> None:
    for tenant, model in (("acme", "default"), ("initech", "tiny"), ("globex", "tiny"), ("globex", "tiny")):
        r = httpx.post(fleet.url + "/v1/completions", json={"model": model, "prompt": "The dashboard", "max_tokens": 4},
                       headers={"Authorization": f"Bearer {fleet.key(tenant)}"}, timeout=60)
        assert r.status_code == 200, r.text


def test_dashboard_renders_live_data_matching_metrics(fleet, browser):
    _send(fleet)
    traffic_done = time.time()
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(fleet.url + "/dashboard?refresh=300")
    page.wait_for_selector("#status[data-updated]", timeout=15000)
    before = float(page.get_attribute("#status", "data-updated"))
    page.wait_for_function(f"Number(document.querySelector('#status').dataset.updated) > {before}", timeout=15000)

    # every chart drew its bars, with values
    for chart in ("cost-per-pool", "cost-per-tenant", "ttft", "tpot", "kv", "prefix", "queues"):
        assert page.locator(f"#{chart} svg rect[data-series]").count() >= 2, chart
    costs = {r.get_attribute("data-label"): float(r.get_attribute("data-value"))
             for r in page.locator("#cost-per-tenant rect[data-series]").all()}
    assert set(costs) == {"acme", "initech", "globex"} and all(v > 0 for v in costs.values())
    ttft = page.locator("#ttft rect[data-series='p99'][data-label='interactive']").get_attribute("data-value")
    assert float(ttft) > 0
    assert page.locator("#ttft line.target[data-label='interactive']").get_attribute("data-target") == "2"

    # numbers on the page == /metrics (no traffic in between)
    text = httpx.get(fleet.url + "/metrics").text
    cells = page.locator("#tenants-table tbody tr").all()
    seen = {}
    for row in cells:
        tds = row.locator("td").all()
        seen[tds[0].inner_text()] = {td.get_attribute("data-key"): td.get_attribute("data-value") for td in tds}
    for tenant in ("acme", "initech", "globex"):
        assert float(seen[tenant]["requests"]) == series(text, "tokenmill:fleet_requests_total", tenant=tenant)
        assert float(seen[tenant]["cost_usd"]) == pytest.approx(series(text, "tokenmill:fleet_cost_usd_total",
                                                                       tenant=tenant), rel=1e-9)
        tokens = (series(text, "tokenmill:fleet_prompt_tokens_total", tenant=tenant)
                  + series(text, "tokenmill:fleet_generation_tokens_total", tenant=tenant))
        expected = series(text, "tokenmill:fleet_cost_usd_total", tenant=tenant) / tokens * 1e6
        assert costs[tenant] == pytest.approx(expected, rel=1e-9)
    pool_price = page.locator("#pools-table tbody tr").first.locator("td[data-key='price_per_hour']")
    assert float(pool_price.get_attribute("data-value")) == series(text, "tokenmill:fleet_pool_price_per_hour_usd",
                                                                  pool="premium")
    assert page.locator("#top-costs tbody tr").count() >= 3

    # time series (the fleet's ring buffer, a point a second): every chart draws its lines, they
    # grow, and the latest point after the traffic says what the bars say
    for chart in ("ts-cost-pool", "ts-cost-tenant", "ts-ttft", "ts-tpot", "ts-queues", "ts-kv"):
        assert page.locator(f"#{chart} svg polyline[data-series]").count() >= 1, chart
    queue_line = "#ts-queues polyline[data-series='fleet:interactive']"
    n = int(page.get_attribute(queue_line, "data-points"))
    page.wait_for_function(f"Number(document.querySelector(\"{queue_line}\").dataset.points) > {n}", timeout=15000)
    page.wait_for_function(f"Number(document.querySelector('#ts-cost-tenant svg').dataset.lastT) > {traffic_done}",
                           timeout=15000)
    for tenant in ("acme", "initech", "globex"):
        line = page.locator(f"#ts-cost-tenant polyline[data-series='{tenant}']")
        assert int(line.get_attribute("data-points")) >= 1
        assert float(line.get_attribute("data-last")) == pytest.approx(costs[tenant], rel=1e-9), tenant
    assert float(page.locator("#ts-ttft polyline[data-series='interactive']").get_attribute("data-last")) > 0
    assert page.locator("#ts-ttft line.target[data-label='interactive']").get_attribute("data-target") == "2"
    page.close()
    assert problems == []
