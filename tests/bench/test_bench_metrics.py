"""Metric functions against hand-computed examples."""

from __future__ import annotations

import pytest

from tokenmill.bench.client import INTERRUPTED, RequestResult
from tokenmill.bench.metrics import (
    SLO,
    cost,
    goodput,
    latency_stats,
    meets_slo,
    parse_prometheus,
    percentile,
    request_tpot,
    server_delta,
    summarize,
)


def ok(ttft: float, e2e: float, out: int, itl: list[float] | None = None, prompt: int = 10,
       usage: bool = True) -> RequestResult:
    return RequestResult(0, 10, out, 0.0, start_s=0.0, success=True, ttft_s=ttft, e2e_s=e2e,
                         itl_s=itl or [], prompt_tokens=prompt, output_tokens=out, usage_reported=usage)


def failed(error: str = "HTTP 500: boom") -> RequestResult:
    return RequestResult(0, 10, 5, 0.0, success=False, error=error)


def test_percentiles_interpolate_linearly() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)  # rank 0.9*9 = 8.1
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_latency_stats_in_ms() -> None:
    s = latency_stats([0.001, 0.002, 0.003, 0.004])
    assert s["mean"] == pytest.approx(2.5)
    assert s["p50"] == pytest.approx(2.5)
    assert s["p99"] == pytest.approx(3.97)  # 3 + 0.97 * (4 - 3)
    assert latency_stats([]) == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}


def test_tpot_excludes_first_token() -> None:
    # 10 tokens: first at 0.1 s, the other 9 over the next 0.9 s -> 0.1 s each
    assert request_tpot(ok(0.1, 1.0, 10)) == pytest.approx(0.1)
    assert request_tpot(ok(0.1, 0.1, 1)) is None  # undefined with one token
    assert request_tpot(failed()) is None


def test_slo_and_goodput() -> None:
    slo = SLO(ttft_ms=200, tpot_ms=50)
    results = [
        ok(0.1, 0.1 + 9 * 0.04, 10),  # ttft 100 ms, tpot 40 ms: good
        ok(0.3, 0.3 + 9 * 0.04, 10),  # ttft 300 ms: misses
        ok(0.1, 0.1 + 9 * 0.06, 10),  # tpot 60 ms: misses
        ok(0.2, 0.2, 1),  # ttft exactly 200 ms, no tpot: good
        failed(),  # failures miss
    ]
    assert [meets_slo(r, slo) for r in results] == [True, False, False, True, False]
    g = goodput(results, slo, duration_s=2.0)
    assert g == {"slo": {"ttft_ms": 200, "tpot_ms": 50}, "good_requests": 2,
                 "requests_per_s": 1.0, "attainment_pct": 40.0}
    assert goodput(results, SLO(), 2.0) is None


def test_cost() -> None:
    c = cost(duration_s=1800, price_per_hour=4.0, output_tokens=500_000, completed=100, total_tokens=2_000_000)
    assert c == {"price_per_hour": 4.0, "total": 2.0, "per_million_output_tokens": 4.0,
                 "per_million_total_tokens": 1.0, "per_request": 0.02}
    assert cost(1800, 4.0, 500_000, 100)["per_million_total_tokens"] is None
    assert cost(10, None, 1, 1) is None
    assert cost(10, 1.0, 0, 0)["per_request"] is None


def test_summary() -> None:
    results = [
        ok(0.1, 1.0, 10, itl=[0.1] * 9, prompt=20),
        ok(0.3, 0.5, 5, itl=[0.05] * 4, prompt=30, usage=False),
        failed(),
        failed(),
        failed(INTERRUPTED),
    ]
    s = summarize(results, duration_s=2.0, num_requests=6, slo=SLO(e2e_ms=800), price_per_hour=36.0)
    assert (s["sent"], s["completed"], s["failed"], s["interrupted"], s["not_sent"]) == (5, 2, 2, 1, 1)
    assert s["errors"] == {"HTTP 500: boom": 2}
    assert s["usage_missing"] == 1
    assert s["total_input_tokens"] == 50 and s["total_output_tokens"] == 15
    assert s["request_throughput"] == 1.0
    assert s["output_throughput"] == 7.5
    assert s["total_token_throughput"] == 32.5
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(75.0)  # (100 + 50) / 2
    assert s["itl_ms"]["mean"] == pytest.approx((9 * 100 + 4 * 50) / 13)
    assert s["e2e_ms"]["p50"] == pytest.approx(750.0)
    assert s["goodput"]["good_requests"] == 1
    assert s["goodput"]["attainment_pct"] == 25.0  # interrupted request left out
    assert s["cost"]["total"] == pytest.approx(0.02)
    assert s["cost"]["per_million_output_tokens"] == pytest.approx(0.02 / 15 * 1e6)
    assert s["cost"]["per_million_total_tokens"] == pytest.approx(0.02 / 65 * 1e6)


EXPOSITION = """\
# HELP tokenmill:request_queue_time_seconds queue time
# TYPE tokenmill:request_queue_time_seconds histogram
tokenmill:request_queue_time_seconds_bucket{le="0.1",model="m"} 3.0
tokenmill:request_queue_time_seconds_bucket{le="+Inf",model="m"} 4.0
tokenmill:request_queue_time_seconds_sum{model="m"} %s
tokenmill:request_queue_time_seconds_count{model="m"} %s
# HELP tokenmill:prefix_cache_queries_total queried tokens
# TYPE tokenmill:prefix_cache_queries_total counter
tokenmill:prefix_cache_queries_total{model="m"} %s
# HELP tokenmill:prefix_cache_hits_total hit tokens
# TYPE tokenmill:prefix_cache_hits_total counter
tokenmill:prefix_cache_hits_total{model="m"} %s
# HELP other_metric something else
# TYPE other_metric gauge
other_metric 7.0
"""


def test_prometheus_delta() -> None:
    before = parse_prometheus(EXPOSITION % (1.0, 4, 100, 20))
    after = parse_prometheus(EXPOSITION % (1.5, 14, 1100, 770))
    assert before["tokenmill:request_queue_time_seconds_count"] == 4
    d = server_delta(before, after)
    assert d == {"mean_queue_time_ms": pytest.approx(50.0), "queued_requests": 10,
                 "prefix_cache_hit_rate": pytest.approx(0.75), "prefix_cache_queries": 1000}


def test_prometheus_absent_or_garbage() -> None:
    assert parse_prometheus(None) == {}
    assert parse_prometheus("other_metric 1\n") == {}
    assert parse_prometheus("<html>not metrics</html>") == {}
    assert server_delta({}, {}) is None


def test_prometheus_vllm_prefix_and_new_series() -> None:
    """vLLM exports the same series under `vllm:`; a series absent from the first scrape (a
    labelled histogram never observed yet) counts from zero."""
    text = EXPOSITION.replace("tokenmill:", "vllm:") + (
        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{model=\"m\"} %s\n"
        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model=\"m\"} %s\n")
    before = parse_prometheus("# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 1\n")
    after = parse_prometheus(text % (0.5, 5, 200, 50, 3, 640))
    d = server_delta(before, after)
    assert d == {"mean_queue_time_ms": pytest.approx(100.0), "queued_requests": 5,
                 "prefix_cache_hit_rate": pytest.approx(0.25), "prefix_cache_queries": 200,
                 "preemptions": 2, "generation_tokens": 640}
    # ours wins when a server exports both
    both = parse_prometheus(EXPOSITION % (1.0, 4, 100, 20) + text % (0.5, 5, 200, 50, 3, 640))
    assert server_delta({}, both)["queued_requests"] == 4


def test_ttft_ignores_role_only_chunk() -> None:
    """A chat stream whose tokens carry no text: TTFT falls back to the chunk that ends the
    choice, not the role-only opening chunk."""
    from tokenmill.bench.client import _Stream

    r = RequestResult(0, 10, 3, 0.0)
    st = _Stream(r, start=100.0)
    st.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, 100.1)
    st.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}, 100.9)
    st.feed({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3}}, 100.95)
    st.finish(101.0)
    assert r.success and r.output_tokens == 3 and r.num_chunks == 0
    assert r.ttft_s == pytest.approx(0.9) and r.e2e_s == pytest.approx(1.0)
