"""tokenmill.metrics: latencies from request timestamps, the cost window, the Prometheus logger."""
from __future__ import annotations

import logging
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenmill.core.kv_cache_manager import PrefixCacheStats
from tokenmill.core.outputs import IterationStats
from tokenmill.core.scheduler import SchedulerStats
from tokenmill.metrics.prometheus import PrometheusStatLogger
from tokenmill.metrics.stats import CostWindow, cost_per_million_tokens, request_timings
from tokenmill.request import FinishReason, Request
from tokenmill.sampling_params import SamplingParams


def _finished_request(arrival=10.0, scheduled=10.5, token_times=(11.0, 11.2, 11.6), finished=11.7,
                      reason=FinishReason.LENGTH) -> Request:
    req = Request("r", [1, 2, 3, 4], SamplingParams(), arrival_time=arrival)
    req.events.first_scheduled = scheduled
    for i, t in enumerate(token_times):
        req.append_token(100 + i, t)
    req.events.finished = finished
    req.finish_reason = reason
    req.num_cached_tokens = 2
    return req


def test_request_timings_from_events():
    t = request_timings(_finished_request())
    assert t.queue_time == pytest.approx(0.5)
    assert t.ttft == pytest.approx(1.0)
    assert t.e2e == pytest.approx(1.7)
    assert t.tpot == pytest.approx(0.3)  # (11.6 - 11.0) / 2
    assert t.itl == pytest.approx([0.2, 0.4])
    assert (t.num_prompt_tokens, t.num_output_tokens, t.num_cached_tokens) == (4, 3, 2)
    assert t.finish_reason == "length"
    one = request_timings(_finished_request(token_times=(11.0,)))
    assert one.tpot is None and one.itl == []
    never = request_timings(Request("x", [1], SamplingParams(), arrival_time=1.0))
    assert never.ttft is None and never.queue_time is None and never.e2e is None


def test_cost_window_formula_and_sliding():
    assert cost_per_million_tokens(3.6, busy_seconds=1.0, tokens=1000) == pytest.approx(1.0)  # $0.001/s / 1000 tok/s
    assert math.isnan(cost_per_million_tokens(1.0, 1.0, 0))
    w = CostWindow(price_per_hour=3.6, window_s=10.0)
    assert math.isnan(w.cost_per_million_output_tokens)
    for _ in range(10):
        w.add(1.0, 100)  # 100 tok/s
    assert w.tokens_per_second == pytest.approx(100)
    assert w.cost_per_million_output_tokens == pytest.approx(10.0)
    for _ in range(10):
        w.add(1.0, 1000)  # the old, slow steps slide out of the 10 s window
    assert w.busy_seconds == pytest.approx(10.0)
    assert w.tokens_per_second == pytest.approx(1000)
    assert w.cost_per_million_output_tokens == pytest.approx(1.0)
    with pytest.raises(ValueError):
        CostWindow(-1.0)


def _samples(logger: PrometheusStatLogger) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(logger.exposition().decode()):
        for s in fam.samples:
            key = s.name + (f"{{{s.labels['finished_reason']}}}" if "finished_reason" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def test_prometheus_logger_counters_gauges_histograms():
    a = PrometheusStatLogger("m", price_per_hour=3.6, cost_window_s=60)
    b = PrometheusStatLogger("other")  # separate registries: no "duplicated timeseries" error
    sched = SchedulerStats(num_running=2, num_waiting=1, kv_usage=0.25, block_fill=0.5, num_preemptions_total=1)
    it = IterationStats(num_prompt_tokens=30, num_generation_tokens=2, num_batched_tokens=32, num_seqs=2,
                        num_preempted=0, schedule_time=0.0, forward_time=0.01, step_time=0.02)
    a.record(sched, it, [], PrefixCacheStats(queries=40, hits=16), evictions=3)
    # cumulative engine totals become counter increments
    sched2 = SchedulerStats(num_running=0, num_waiting=0, kv_usage=0.0, block_fill=0.0, num_preemptions_total=3)
    a.record(sched2, it, [_finished_request(), _finished_request(reason=FinishReason.STOP)],
             PrefixCacheStats(queries=100, hits=48), evictions=3)
    s = _samples(a)
    assert s["tokenmill:prefix_cache_queries_total"] == 100
    assert s["tokenmill:prefix_cache_hits_total"] == 48
    assert s["tokenmill:kv_cache_evictions_total"] == 3
    assert s["tokenmill:num_preemptions_total"] == 3
    assert s["tokenmill:prompt_tokens_total"] == 60
    assert s["tokenmill:generation_tokens_total"] == 4
    assert s["tokenmill:engine_busy_seconds_total"] == pytest.approx(0.04)
    assert s["tokenmill:num_requests_running"] == 0 and s["tokenmill:kv_cache_usage_perc"] == 0
    assert s["tokenmill:request_success_total{length}"] == 1 and s["tokenmill:request_success_total{stop}"] == 1
    assert s["tokenmill:time_to_first_token_seconds_count"] == 2
    assert s["tokenmill:time_to_first_token_seconds_sum"] == pytest.approx(2.0)
    assert s["tokenmill:request_queue_time_seconds_sum"] == pytest.approx(1.0)
    assert s["tokenmill:e2e_request_latency_seconds_sum"] == pytest.approx(3.4)
    assert s["tokenmill:time_per_output_token_seconds_count"] == 2
    assert s["tokenmill:inter_token_latency_seconds_count"] == 4
    assert s["tokenmill:price_per_hour_usd"] == 3.6
    # 4 tokens in 0.04 busy seconds at $3.6/h: 0.001 $/s * 0.04 s / 4 tok * 1e6
    assert s["tokenmill:cost_per_million_output_tokens_usd"] == pytest.approx(10.0)
    assert math.isnan(_samples(b)["tokenmill:cost_per_million_output_tokens_usd"])


def test_a_failing_stat_logger_is_logged_and_serving_goes_on(tiny_llm, caplog):
    """The engine calls every stat logger in a guard: a broken one is logged with its traceback
    each time it fails, the others still record, and generation is unaffected."""
    class Broken:
        def record(self, *args):
            raise RuntimeError("sink down")

    engine = tiny_llm.llm_engine
    good = PrometheusStatLogger("m")
    engine.stat_loggers[:] = [Broken(), good]
    tm_logger = logging.getLogger("tokenmill")  # does not propagate to the root: attach the capture
    tm_logger.addHandler(caplog.handler)
    try:
        out = tiny_llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, ignore_eos=True),
                                use_tqdm=False)
    finally:
        engine.stat_loggers.clear()
        tm_logger.removeHandler(caplog.handler)
    assert len(out[0].outputs[0].token_ids) == 3
    failures = [r for r in caplog.records if "stat logger Broken failed" in r.getMessage()]
    assert failures and all(r.exc_info for r in failures)
    assert _samples(good)["tokenmill:generation_tokens_total"] == 3


def test_periodic_log_line_while_busy_silent_while_idle(caplog):
    from tokenmill.core.clock import ManualClock
    from tokenmill.metrics.log_stats import LoggingStatLogger
    clock = ManualClock()
    lg = LoggingStatLogger(interval_s=5.0, clock=clock)
    tm_logger = logging.getLogger("tokenmill")
    tm_logger.addHandler(caplog.handler)
    try:
        busy = SchedulerStats(num_running=3, num_waiting=1, kv_usage=0.25)
        prefix = PrefixCacheStats(queries=0, hits=0)
        lg.record(busy, IterationStats.idle(), [], prefix, 0)
        for _ in range(10):  # 10 steps in 5 s: 100 prompt + 2 generated tokens each
            clock.advance(0.5)
            prefix = PrefixCacheStats(queries=prefix.queries + 100, hits=prefix.hits + 40)
            lg.record(busy, IterationStats(100, 2, 102, 3, 0, 0.0, 0.5, 0.5), [], prefix, 0)
        lines = [r.getMessage() for r in caplog.records if "Avg prompt throughput" in r.getMessage()]
        assert lines == ["Avg prompt throughput: 200.0 tokens/s, Avg generation throughput: 4.0 tokens/s, "
                         "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 40.0%, "
                         "Preemptions: 0"]
        idle = SchedulerStats()
        for _ in range(4):
            clock.advance(5.0)
            lg.record(idle, IterationStats.idle(), [], prefix, 0)
        assert len([r for r in caplog.records if "Avg prompt throughput" in r.getMessage()]) == 1
    finally:
        tm_logger.removeHandler(caplog.handler)
