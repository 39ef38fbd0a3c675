"""The fleet's Prometheus series (`tokenmill:fleet_*`, labels `pool`, `tenant`, `slo_class`,
`model`) and the recent latency samples the dashboard's percentiles come from.

  counters    fleet_requests_total{model,pool,tenant,slo_class,status}, fleet_prompt_tokens_total,
              fleet_generation_tokens_total, fleet_device_seconds_total, fleet_cost_usd_total (same
              labels but status), fleet_routing_decisions_total{slo_class,pool,reason},
              fleet_requests_shed_total{tenant,slo_class,reason}, fleet_replica_restarts_total{pool}
  histograms  fleet_time_to_first_token_seconds{pool,slo_class}, fleet_time_per_output_token_seconds
              (the engines' own TTFT/TPOT, from each response's usage extension)
  gauges      fleet_pool_in_flight{pool}, fleet_pool_replicas_healthy{pool},
              fleet_pool_price_per_hour_usd{pool} (all replicas), fleet_pool_kv_cache_usage_perc{pool}
              (mean over replicas), fleet_pool_kv_block_fill_ratio{pool},
              fleet_pool_prefix_cache_hit_rate{pool} (hits / queries since start),
              fleet_pool_engine_waiting{pool}, fleet_pool_busy_seconds{pool}, fleet_pool_wall_seconds{pool},
              fleet_pool_utilization{pool} (busy / wall), fleet_pool_idle_cost_usd{pool},
              fleet_queue_length{slo_class} (waiting in the fleet), fleet_slo_target_seconds{slo_class,metric},
              fleet_pool_awake{pool}, fleet_switch_group_switches{group}, fleet_switch_group_switch_seconds{group}
              (switch groups)
"""
from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tokenmill.metrics.prometheus import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS

P = "tokenmill:fleet_"
LEDGER_LABELS = ["model", "pool", "tenant", "slo_class"]
WINDOW = 2000  # recent samples per SLO class for the dashboard's percentiles


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None without values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


class FleetMetrics:
    def __init__(self) -> None:
        self.registry = reg = CollectorRegistry()
        self.requests = Counter(P + "requests", "Requests that reached an engine, by outcome.",
                                LEDGER_LABELS + ["status"], registry=reg)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests.", LEDGER_LABELS,
                                     registry=reg)
        self.gen_tokens = Counter(P + "generation_tokens", "Output tokens of finished requests.", LEDGER_LABELS,
                                  registry=reg)
        self.device_seconds = Counter(P + "device_seconds", "Device-seconds the engines charged requests (their "
                                      "share, by tokens, of each step).", LEDGER_LABELS, registry=reg)
        self.cost = Counter(P + "cost_usd", "device_seconds x the pool's price per hour / 3600.", LEDGER_LABELS,
                            registry=reg)
        self.decisions = Counter(P + "routing_decisions", "Routing decisions and their reasons.",
                                 ["slo_class", "pool", "reason"], registry=reg)
        self.shed = Counter(P + "requests_shed", "Requests answered 429 (or 503 without a pool).",
                            ["tenant", "slo_class", "reason"], registry=reg)
        self.restarts = Counter(P + "replica_restarts", "Replicas the fleet started again after their engine "
                                "process died (`launcher: process`; Ray restarts its own).", ["pool"], registry=reg)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Engine TTFT of finished requests.",
                              ["pool", "slo_class"], buckets=TTFT_BUCKETS, registry=reg)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Engine TPOT of finished requests.",
                              ["pool", "slo_class"], buckets=TOKEN_LATENCY_BUCKETS, registry=reg)

        def gauge(name, doc, labels=("pool",)):
            return Gauge(P + name, doc, list(labels), registry=reg)

        self.in_flight = gauge("pool_in_flight", "Requests the fleet has in flight on the pool.")
        self.healthy = gauge("pool_replicas_healthy", "Healthy replicas of the pool.")
        self.price = gauge("pool_price_per_hour_usd", "Price per hour of all the pool's replicas.")
        self.kv_usage = gauge("pool_kv_cache_usage_perc", "Mean KV cache usage of the pool's replicas (0..1).")
        self.block_fill = gauge("pool_kv_block_fill_ratio", "Mean KV block fill of the pool's replicas (0..1).")
        self.prefix_hit = gauge("pool_prefix_cache_hit_rate", "Prefix cache hits / queries since start (tokens).")
        self.engine_waiting = gauge("pool_engine_waiting", "Requests waiting inside the pool's engines.")
        self.busy = gauge("pool_busy_seconds", "Engine busy seconds of the pool's replicas since they started.")
        self.wall = gauge("pool_wall_seconds", "Seconds the pool's replicas have been up (summed).")
        self.utilization = gauge("pool_utilization", "busy / wall seconds of the pool (0..1).")
        self.idle_cost = gauge("pool_idle_cost_usd", "(wall - busy) seconds x price per hour / 3600.")
        self.queue = gauge("queue_length", "Requests waiting in the fleet for capacity.", ("slo_class",))
        self.target = gauge("slo_target_seconds", "Targets of each SLO class.", ("slo_class", "metric"))
        self.awake = gauge("pool_awake", "1 for the awake pool of a switch group, 0 for the sleeping ones.")
        self.switches = gauge("switch_group_switches", "Times the group switched its awake pool.", ("group",))
        self.switch_seconds = gauge("switch_group_switch_seconds", "Seconds spent switching (sleep + wake up).",
                                    ("group",))
        self.recent: dict[str, dict[str, deque[float]]] = {}  # slo_class -> {"ttft"|"tpot": samples}
        # the same with the unix time of each (the dashboard's time series: p99 of the last seconds)
        self.timed: dict[str, dict[str, deque[tuple[float, float]]]] = {}

    def observe_latency(self, pool: str, slo_class: str, ttft_s: float | None, tpot_s: float | None) -> None:
        recent = self.recent.setdefault(slo_class, {"ttft": deque(maxlen=WINDOW), "tpot": deque(maxlen=WINDOW)})
        timed = self.timed.setdefault(slo_class, {"ttft": deque(maxlen=WINDOW), "tpot": deque(maxlen=WINDOW)})
        now = time.time()
        if ttft_s is not None:
            self.ttft.labels(pool, slo_class).observe(ttft_s)
            recent["ttft"].append(ttft_s)
            timed["ttft"].append((now, ttft_s))
        if tpot_s is not None:
            self.tpot.labels(pool, slo_class).observe(tpot_s)
            recent["tpot"].append(tpot_s)
            timed["tpot"].append((now, tpot_s))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
