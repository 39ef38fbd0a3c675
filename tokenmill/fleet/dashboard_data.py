"""The JSON the dashboard polls (/dashboard/data). Every total is read from the same Prometheus
counters /metrics exports, so the page and /metrics agree; percentiles come from the recent
samples of each SLO class; the top cost lines from the ledger (all time); `history`, the time
series the fleet keeps (timeseries.py: one point per second, the last 10 minutes)."""
from __future__ import annotations

import math
import time

from tokenmill.fleet.ledger_summary import request_totals
from tokenmill.fleet.metrics import percentile
from tokenmill.fleet.runtime import FleetRuntime
from tokenmill.fleet.timeseries import gauge_by, per_million, sum_by

TOP_LINES = 10


_per_million = per_million


def _clean(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def snapshot(rt: FleetRuntime) -> dict:
    m = rt.metrics
    totals = {}
    for key in ("pool", "tenant"):
        totals[key] = {name: sum_by(metric, key) for name, metric in
                       (("requests", m.requests), ("prompt_tokens", m.prompt_tokens),
                        ("completion_tokens", m.gen_tokens), ("cost_usd", m.cost),
                        ("device_seconds", m.device_seconds))}
    gauges = {name: gauge_by(g, "pool") for name, g in
              (("in_flight", m.in_flight), ("replicas_healthy", m.healthy), ("kv_usage", m.kv_usage),
               ("block_fill", m.block_fill), ("prefix_hit_rate", m.prefix_hit), ("engine_waiting", m.engine_waiting),
               ("utilization", m.utilization), ("idle_cost_usd", m.idle_cost), ("price_per_hour", m.price))}

    def row(key: str, name: str) -> dict:
        t = {k: v.get(name, 0.0) for k, v in totals[key].items()}
        t["usd_per_1m_tokens"] = _per_million(t["cost_usd"], t["prompt_tokens"] + t["completion_tokens"])
        return t

    pools = []
    for p in rt.pools:
        r = {"name": p.name, "model": p.config.model_label, "hardware": p.config.hardware.name,
             "cores": p.config.hardware.cores,
             "replicas": [{"name": r.name, "url": r.url, "healthy": r.healthy} for r in p.replicas],
             **row("pool", p.name)}
        r.update({k: v.get(p.name, 0.0) for k, v in gauges.items()})
        pools.append(r)
    shed = sum_by(m.shed, "tenant")
    tenants = [{"name": name, "slo_class": t.slo_class, "shed": shed.get(name, 0.0), **row("tenant", name)}
               for name, t in rt.config.tenants.items()]
    classes = []
    for name, c in rt.config.slo_classes.items():
        recent = m.recent.get(name, {"ttft": [], "tpot": []})
        ttft, tpot = list(recent["ttft"]), list(recent["tpot"])
        classes.append({"name": name, "ttft_target_s": c.ttft_ms / 1e3 if c.ttft_ms else None,
                        "tpot_target_s": c.tpot_ms / 1e3 if c.tpot_ms else None,
                        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
                        "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
                        "samples": len(ttft), "queue_length": rt.router.waiting[name]})
    top = request_totals_top(rt)
    return {"time": time.time(), "pools": pools, "tenants": tenants, "slo_classes": classes, "top_costs": top,
            "history": rt.history.points()}


def request_totals_top(rt: FleetRuntime) -> list[dict]:
    lines = rt.ledger.run(lambda conn: request_totals(conn))[:TOP_LINES]
    return [{k: _clean(v) for k, v in r.items()} for r in lines]
