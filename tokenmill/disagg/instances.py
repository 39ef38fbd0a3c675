"""The router's view of its engines: load from each one's /metrics, prefix-cache contents from its
/v1/kv/events (stored/evicted block hashes), health from both; refreshed every `interval_s`."""
from __future__ import annotations

import asyncio
import logging

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenmill.disagg.policy import InstanceState

logger = logging.getLogger(__name__)

_GAUGES = {"tokenmill:num_requests_running": "num_running", "tokenmill:num_requests_waiting": "num_waiting",
           "tokenmill:kv_cache_usage_perc": "kv_usage", "tokenmill:generation_tokens_total": "generation_tokens",
           "tokenmill:inter_token_latency_seconds_sum": "itl_sum_s",
           "tokenmill:inter_token_latency_seconds_count": "itl_count"}


def parse_load(text: str) -> dict[str, float]:
    """The load gauges and the planner's counters of a tokenmill /metrics page (summed over label sets)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _GAUGES.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + sample.value
    return out


class InstanceMonitor:
    def __init__(self, instances: list[InstanceState], client: httpx.AsyncClient, interval_s: float = 0.2) -> None:
        self.instances = instances
        self.client = client
        self.interval_s = interval_s
        self.block_size: int | None = None
        self.hash_key: str | None = None
        self._seq = {inst.url: 0 for inst in instances}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> None:
        await asyncio.gather(*(self._refresh_one(inst) for inst in self.instances))

    async def _refresh_one(self, inst: InstanceState) -> None:
        try:
            metrics = await self.client.get(f"{inst.url}/metrics", timeout=2.0)
            metrics.raise_for_status()
            load = parse_load(metrics.text)
            events = await self.client.get(f"{inst.url}/v1/kv/events", params={"since": self._seq[inst.url]},
                                           timeout=2.0)
            events.raise_for_status()
            body = events.json()
        except (httpx.HTTPError, ValueError) as e:
            if inst.healthy:
                logger.warning("instance %s is unreachable (%s): not routing to it", inst.url, e)
            inst.healthy = False
            return
        inst.num_running = int(load.get("num_running", 0))
        inst.num_waiting = int(load.get("num_waiting", 0))
        inst.kv_usage = float(load.get("kv_usage", 0.0))
        inst.generation_tokens = load.get("generation_tokens", 0.0)
        inst.itl_sum_s, inst.itl_count = load.get("itl_sum_s", 0.0), load.get("itl_count", 0.0)
        self._apply_events(inst, body)
        if not inst.healthy:
            logger.info("instance %s is back", inst.url)
        inst.healthy = True

    def _apply_events(self, inst: InstanceState, body: dict) -> None:
        if self.block_size is None:
            self.block_size, self.hash_key = int(body["block_size"]), str(body["hash_key"])
        if body["reset"]:
            inst.cached = set()
        inst.cached.update(bytes.fromhex(h) for h in body["stored"])
        inst.cached.difference_update(bytes.fromhex(h) for h in body["removed"])
        self._seq[inst.url] = int(body["seq"])

    def mark_down(self, inst: InstanceState) -> None:
        inst.healthy = False
        self._seq[inst.url] = 0  # a restarted engine starts a new log
