"""The running fleet: its replicas, router, metrics and ledger, and the loops that keep them fresh.

Every second it scrapes each replica's /metrics (KV usage, engine queues, prefix hits, busy
seconds) and starts again a local replica whose process died (Ray restarts its own actors); every `idle_cost_interval_s` it writes each replica's wall and busy seconds to the ledger
(idle cost, utilization). `finish` is called once per request that reached an engine: it releases
the request's place, bills it in the ledger and counts it in the metrics.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tokenmill.fleet.config import FleetConfig
from tokenmill.fleet.ledger import Ledger, PoolTimeEntry, RequestEntry
from tokenmill.fleet.metrics import FleetMetrics
from tokenmill.fleet.policy import Decision
from tokenmill.fleet.replica import Replica, make_replica
from tokenmill.fleet.router import Lease, PoolRuntime, Router
from tokenmill.fleet.switching import SwitchGroup
from tokenmill.fleet.timeseries import SeriesRing, point

logger = logging.getLogger(__name__)
BUSY = "tokenmill:engine_busy_seconds_total"
SCRAPE_INTERVAL_S = 1.0


@dataclass
class _Clock:
    """Per replica: where the last pool_time row ended."""
    at: float
    busy: float


@dataclass(frozen=True)
class Usage:
    """What a finished response said about itself (its usage and usage.tokenmill)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prefill_device_seconds: float = 0.0
    decode_device_seconds: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def from_body(cls, usage: dict | None) -> Usage:
        if not usage:
            return cls()
        ext = usage.get("tokenmill") or {}
        details = usage.get("prompt_tokens_details") or {}
        return cls(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                   int(details.get("cached_tokens") or 0), float(ext.get("prefill_device_seconds") or 0.0),
                   float(ext.get("decode_device_seconds") or 0.0), ext.get("ttft_s"), ext.get("tpot_s"))


class FleetRuntime:
    def __init__(self, config: FleetConfig, log_dir: Path, ledger_path: str | Path | None = None,
                 ready_timeout: float = 300.0) -> None:
        self.config = config
        self.ready_timeout = ready_timeout
        self.pools = [PoolRuntime(p, [make_replica(p, i, log_dir) for i in range(p.replicas)])
                      for p in config.pools]
        self.router = Router(config, self.pools, on_decision=self._on_decision)
        self.metrics = FleetMetrics()
        self.ledger = Ledger(ledger_path or config.ledger)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        self.groups = self._switch_groups()
        self.history = SeriesRing()  # the dashboard's time series, a point per scrape
        self._clocks: dict[str, _Clock] = {}
        self._wall: dict[str, float] = {}  # replica -> wall seconds billed since the fleet started
        self._busy: dict[str, float] = {}
        self._tasks: list[asyncio.Task] = []
        self.started = False
        for name, c in config.slo_classes.items():
            if c.ttft_ms:
                self.metrics.target.labels(name, "ttft").set(c.ttft_ms / 1e3)
            if c.tpot_ms:
                self.metrics.target.labels(name, "tpot").set(c.tpot_ms / 1e3)
            self.metrics.queue.labels(name).set(0)
        for p in self.pools:
            self.metrics.price.labels(p.name).set(p.config.hardware.price_per_hour * p.config.replicas)

    def _switch_groups(self) -> list[SwitchGroup]:
        members: dict[str, list[PoolRuntime]] = {}
        for p in self.pools:
            if p.config.switch_group is not None:
                members.setdefault(p.config.switch_group, []).append(p)
        groups = [SwitchGroup(name, pools, self.config.switch_quantum_s) for name, pools in members.items()]
        self.router.groups = {p.name: g for g in groups for p in g.pools.values()}
        self.router.client = self.client
        return groups

    def replicas(self) -> list[Replica]:
        return [r for p in self.pools for r in p.replicas]

    async def start(self) -> None:
        if any(p.launcher == "ray" for p in self.config.pools):
            from tokenmill.ray.launcher import connect
            connect(self.config.ray_address)
        for r in self.replicas():
            r.start()
        try:
            await asyncio.gather(*(r.wait_ready(self.client, self.ready_timeout) for r in self.replicas()))
        except Exception:
            self.stop_replicas()
            raise
        for g in self.groups:
            await g.sleep_all_but_first(self.client)
        for r in self.replicas():
            await r.scrape(self.client)
            self._clocks[r.name] = _Clock(time.monotonic(), r.metrics[BUSY])
        self._tasks = [asyncio.create_task(self._every(SCRAPE_INTERVAL_S, self.scrape)),
                       asyncio.create_task(self._every(self.config.idle_cost_interval_s, self.bill_pool_time))]
        self.started = True
        logger.info("fleet ready: %s", ", ".join(f"{p.name} ({p.config.model_label}, {len(p.replicas)} replica(s))"
                                                  for p in self.pools))

    async def _every(self, interval: float, fn) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:  # a failed scrape or write must not end the loop
                logger.exception("fleet background task failed")

    async def scrape(self) -> None:
        for p in self.pools:
            for r in p.replicas:
                if r.revive():  # its engine died: started again, healthy at its first good scrape
                    self.metrics.restarts.labels(p.name).inc()
        await asyncio.gather(*(r.scrape(self.client) for r in self.replicas()))
        self.update_gauges()
        self.history.add(point(self.metrics, [p.name for p in self.pools], list(self.config.slo_classes),
                               list(self.config.tenants), dict(self.router.waiting)))

    def update_gauges(self) -> None:
        m = self.metrics
        for p in self.pools:
            reps = p.healthy()
            n = max(1, len(reps))
            m.in_flight.labels(p.name).set(sum(p.in_flight.values()))
            m.healthy.labels(p.name).set(len(reps))
            m.kv_usage.labels(p.name).set(sum(r.metrics["tokenmill:kv_cache_usage_perc"] for r in reps) / n)
            m.block_fill.labels(p.name).set(sum(r.metrics["tokenmill:kv_block_fill_ratio"] for r in reps) / n)
            q = sum(r.metrics["tokenmill:prefix_cache_queries_total"] for r in reps)
            h = sum(r.metrics["tokenmill:prefix_cache_hits_total"] for r in reps)
            m.prefix_hit.labels(p.name).set(h / q if q else 0.0)
            m.engine_waiting.labels(p.name).set(sum(r.metrics["tokenmill:num_requests_waiting"] for r in reps))
            wall = sum(self._wall.get(r.name, 0.0) for r in p.replicas)
            busy = sum(self._busy.get(r.name, 0.0) for r in p.replicas)
            m.wall.labels(p.name).set(wall)
            m.busy.labels(p.name).set(busy)
            m.utilization.labels(p.name).set(busy / wall if wall else 0.0)
            m.idle_cost.labels(p.name).set(max(0.0, wall - busy) * p.config.hardware.price_per_hour / 3600)
        for cls in self.config.slo_classes:
            m.queue.labels(cls).set(self.router.waiting[cls])
        for g in self.groups:
            m.switches.labels(g.name).set(g.switches)
            m.switch_seconds.labels(g.name).set(g.switch_seconds)
            for name in g.pools:
                m.awake.labels(name).set(1.0 if name == g.awake else 0.0)

    async def bill_pool_time(self) -> None:
        """One pool_time row per replica for the time since its last row (scrapes first)."""
        await asyncio.gather(*(r.scrape(self.client) for r in self.replicas()))
        now_m, now_u = time.monotonic(), time.time()
        for p in self.pools:
            for r in p.replicas:
                last = self._clocks.get(r.name)
                if last is None:
                    continue
                busy_now = r.metrics[BUSY]
                wall, busy = now_m - last.at, max(0.0, busy_now - last.busy)
                self._clocks[r.name] = _Clock(now_m, busy_now)
                self._wall[r.name] = self._wall.get(r.name, 0.0) + wall
                self._busy[r.name] = self._busy.get(r.name, 0.0) + busy
                hw = p.config.hardware
                self.ledger.record_pool_time(PoolTimeEntry(now_u, p.name, r.name, p.config.model_label, hw.name,
                                                           hw.price_per_hour, wall, busy))
        self.update_gauges()

    async def finish(self, lease: Lease, tenant: str, slo_class: str, request_id: str, usage: Usage,
                     status: str, e2e_s: float) -> None:
        """The request ended on its replica: free its place, bill it, count it."""
        pool, replica = lease.pool, lease.replica
        self.router.release(lease, usage.ttft_s, usage.tpot_s, e2e_s if status == "ok" else None)
        hw = pool.config.hardware
        model = lease.model or pool.config.model_label
        entry = RequestEntry(time.time(), request_id, model, pool.name, replica.name, hw.name, tenant,
                             slo_class, status, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
                             usage.prefill_device_seconds, usage.decode_device_seconds, hw.price_per_hour,
                             usage.ttft_s, usage.tpot_s, e2e_s)
        self.ledger.record_request(entry)
        m, labels = self.metrics, (model, pool.name, tenant, slo_class)
        m.requests.labels(*labels, status).inc()
        m.prompt_tokens.labels(*labels).inc(usage.prompt_tokens)
        m.gen_tokens.labels(*labels).inc(usage.completion_tokens)
        m.device_seconds.labels(*labels).inc(entry.device_seconds)
        m.cost.labels(*labels).inc(entry.cost_usd)
        if status == "ok":
            m.observe_latency(pool.name, slo_class, usage.ttft_s, usage.tpot_s)
        m.in_flight.labels(pool.name).set(sum(pool.in_flight.values()))
        await self.router.notify()  # last: the bookkeeping above is done even if this await is cancelled

    def _on_decision(self, slo_class: str, d: Decision) -> None:
        self.metrics.decisions.labels(slo_class, d.pool or "", d.reason.value).inc()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.started:
            with contextlib.suppress(Exception):
                await self.bill_pool_time()
        self.stop_replicas()
        await self.client.aclose()
        self.ledger.close()

    def stop_replicas(self) -> None:
        for r in self.replicas():
            r.stop()
