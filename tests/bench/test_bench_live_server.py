"""End-to-end: `bench serve` against our real server (`python -m tokenmill.server`, tiny model).

One server process for the module, started with the e2e helpers (tests/e2e/e2e_helpers.py) and
`--price-per-hour 2.5`. The harness runs in-process; the server's own /metrics are scraped by the
test too, to check that the harness's server deltas and token counts agree with what the engine
counted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from e2e_helpers import TINY_CHAT_TEMPLATE, TINY_ENGINE_ARGS, ServerProcess

from tokenmill.bench.metrics import parse_prometheus
from tokenmill.bench.serve import main
from tokenmill.bench.slos import DEFAULT_SLOS

SERVER_PRICE = 2.5


@pytest.fixture(scope="module")
def live_server(tiny_llama: Path, tmp_path_factory: Any) -> Any:
    args = [str(tiny_llama), *TINY_ENGINE_ARGS, "--chat-template", TINY_CHAT_TEMPLATE,
            "--served-model-name", "tiny", "--price-per-hour", str(SERVER_PRICE)]
    srv = ServerProcess(args, "bench_live", tmp_path_factory.mktemp("bench_live_logs")).start()
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def server_totals(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=10).text)


def test_sweep_against_live_server(live_server: Any, tiny_llama: Path, tmp_path: Path) -> None:
    before = server_totals(live_server.url)
    out = tmp_path / "live"
    rc = main(["serve", "--base-url", live_server.url, "--out", str(out), "--disable-tqdm",
               "--workload", "random", "--input-len", "40", "--output-len", "8", "--num-requests", "12",
               "--sweep", "4,inf", "--tokenizer", str(tiny_llama), "--slo-ttft-ms", "10000",
               "--slo-tpot-ms", "5000", "--price-per-hour", "1.0"])
    assert rc == 0
    for name in ("sweep.json", "report.md", "latency_cdf.png", "sweep_throughput.png",
                 "sweep_p99_latency.png", "rate_4/results.json", "rate_4/report.md", "rate_4/latency_cdf.png",
                 "rate_inf/results.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for png in out.rglob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    report = (out / "report.md").read_text()
    assert "Server mean queue time" in report and "Server prefix-cache hit rate" in report
    assert "| SLO attained (%) | Cost ($/1M output tok) | Cost ($/1M total tok) |" in report  # sweep table
    assert (out / "sweep_cost.png").is_file()

    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert [r["request_rate"] for r in runs] == [4.0, "inf"]
    all_requests = []
    for label in ("4", "inf"):
        data = json.loads((out / f"rate_{label}" / "results.json").read_text())
        s, reqs = data["summary"], data["requests"]
        assert data["meta"]["model"] == "tiny"
        assert (s["completed"], s["failed"], s["sent"], s["usage_missing"]) == (12, 0, 12, 0), s["errors"]
        for r in reqs:
            assert r["success"] and r["usage_reported"]
            assert r["output_tokens"] == r["max_tokens"]  # ignore_eos: exactly what was asked
            assert abs(r["prompt_tokens"] - r["input_len"]) <= 2  # --tokenizer makes lengths exact
            assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert s["total_output_tokens"] == sum(r["max_tokens"] for r in reqs)
        assert s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p50"] > 0 and s["e2e_ms"]["p99"] > 0
        assert s["goodput"]["good_requests"] == 12 and s["goodput"]["attainment_pct"] == 100.0
        assert s["cost"]["per_million_output_tokens"] == pytest.approx(
            s["duration_s"] / 3600 / s["total_output_tokens"] * 1e6)
        assert s["cost"]["price_source"] == "flag"  # --price-per-hour 1.0 wins over the server's 2.5
        assert s["goodput"]["slo_source"] == {"ttft_ms": "flag", "tpot_ms": "flag"}
        # the /metrics scrape: our server's series, as deltas over this rate's run only
        srv = s["server"]
        assert srv is not None, "no tokenmill:* series scraped from /metrics"
        assert srv["queued_requests"] == 12 and srv["mean_queue_time_ms"] >= 0
        assert srv["prefix_cache_queries"] == s["total_input_tokens"]
        assert 0 <= srv["prefix_cache_hit_rate"] <= 1
        assert srv["generation_tokens"] == s["total_output_tokens"]
        assert srv["preemptions"] == 0
        # each rate gets new prompt text: the second run must not hit what the first one cached
        assert srv["prefix_cache_hit_rate"] < 0.2
        all_requests += reqs

    after = server_totals(live_server.url)
    gen = "tokenmill:generation_tokens_total"
    assert after[gen] - before.get(gen, 0) == sum(r["output_tokens"] for r in all_requests)


def test_chat_workload_against_live_server(live_server: Any, tiny_llama: Path, tmp_path: Path,
                                           capsys: Any) -> None:
    """`--workload chat` goes to the chat endpoint by default, whose role-only first chunk must not
    count as the first token; with no --price-per-hour and no SLO flags, the server's price and the
    workload's default SLOs apply, and say so."""
    out = tmp_path / "chat"
    rc = main(["serve", "--base-url", live_server.url, "--out", str(out), "--disable-tqdm",
               "--workload", "chat", "--input-len", "12", "--output-len", "6",
               "--num-requests", "4", "--request-rate", "inf", "--max-concurrency", "2",
               "--tokenizer", str(tiny_llama)])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    s, meta = data["summary"], data["meta"]
    assert (s["completed"], s["failed"]) == (4, 0), s["errors"]
    assert (meta["endpoint"], meta["endpoint_source"]) == ("chat", "default")
    for r in data["requests"]:
        assert r["output_tokens"] == r["max_tokens"]
        assert r["prompt_tokens"] > r["input_len"]  # the chat template adds tokens: the chat endpoint
    assert s["server"]["queued_requests"] == 4

    # the price from the server's /metrics
    assert (meta["price_per_hour"], meta["price_source"]) == (SERVER_PRICE, "server")
    assert s["cost"]["price_per_hour"] == SERVER_PRICE and s["cost"]["price_source"] == "server"
    assert s["cost"]["per_million_output_tokens"] == pytest.approx(
        s["duration_s"] / 3600 * SERVER_PRICE / s["total_output_tokens"] * 1e6)
    server_said = "$2.5/h from the server's tokenmill:price_per_hour_usd"
    assert f"price: {server_said}" in capsys.readouterr().out
    assert f"| Price | {server_said} |" in (out / "report.md").read_text()
    # the chat workload's default SLOs, marked as defaults
    assert meta["slo"] == DEFAULT_SLOS["chat"].values()
    assert s["goodput"]["slo_source"] == {"ttft_ms": "default", "tpot_ms": "default"}
    assert "(default for chat)" in (out / "report.md").read_text()
