"""The dashboard's time series: a ring buffer of small snapshots, one per scrape (every second),
kept by the fleet so a page opened late still sees the last minutes.

Each point: the unix time `t`; cumulative $ per 1M tokens (input + output) per pool and per tenant
(as the bars, from the same counters as /metrics); TTFT and TPOT p99 per SLO class over the
requests that finished in the last `LATENCY_WINDOW_S` seconds (None without any); queue lengths
(the fleet's per class, `fleet:<class>`, and the engines' waiting requests per pool,
`engine:<pool>`); KV cache usage per pool.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

from tokenmill.fleet.metrics import FleetMetrics, percentile

CAPACITY = 600  # points: 10 minutes at one per second
LATENCY_WINDOW_S = 30.0


def _samples(metric) -> list:
    return [s for family in metric.collect() for s in family.samples if not s.name.endswith("_created")]


def sum_by(metric, label: str) -> dict[str, float]:
    """A labelled counter's totals per value of one label."""
    out: dict[str, float] = {}
    for s in _samples(metric):
        out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def gauge_by(metric, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for s in _samples(metric)}


def per_million(cost: float, tokens: float) -> float | None:
    return cost / tokens * 1e6 if tokens else None


def usd_per_1m(m: FleetMetrics, label: str) -> dict[str, float | None]:
    cost, p, g = sum_by(m.cost, label), sum_by(m.prompt_tokens, label), sum_by(m.gen_tokens, label)
    return {k: per_million(cost.get(k, 0.0), p.get(k, 0.0) + g.get(k, 0.0)) for k in set(cost) | set(p) | set(g)}


def latency_p99(m: FleetMetrics, slo_class: str, metric: str, now: float) -> float | None:
    timed = m.timed.get(slo_class, {}).get(metric, ())
    return percentile([v for t, v in timed if now - t <= LATENCY_WINDOW_S], 99)


class SeriesRing:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._points: deque[dict[str, Any]] = deque(maxlen=capacity)

    def add(self, point: dict[str, Any]) -> None:
        self._points.append(point)

    def points(self) -> list[dict[str, Any]]:
        return list(self._points)


def point(m: FleetMetrics, pools: list[str], classes: list[str], tenants: list[str],
          fleet_queue: dict[str, int], now: float | None = None) -> dict[str, Any]:
    """One point from the fleet's metrics (its gauges updated just before)."""
    now = time.time() if now is None else now
    pool_cost, tenant_cost = usd_per_1m(m, "pool"), usd_per_1m(m, "tenant")
    engine_waiting, kv = gauge_by(m.engine_waiting, "pool"), gauge_by(m.kv_usage, "pool")
    return {"t": now,
            "pool_usd_per_1m": {p: pool_cost.get(p) for p in pools},
            "tenant_usd_per_1m": {t: tenant_cost.get(t) for t in tenants},
            "ttft_p99_s": {c: latency_p99(m, c, "ttft", now) for c in classes},
            "tpot_p99_s": {c: latency_p99(m, c, "tpot", now) for c in classes},
            "queue": {**{f"fleet:{c}": fleet_queue.get(c, 0) for c in classes},
                      **{f"engine:{p}": engine_waiting.get(p, 0.0) for p in pools}},
            "kv_usage": {p: kv.get(p, 0.0) for p in pools}}
