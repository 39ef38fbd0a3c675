"""Admission over live pool state (no processes): a batch request waits for idle capacity and gets
it when a request finishes; it is shed (429) when its wait runs out or the fleet's queue is full,
while interactive traffic is still routed."""
import asyncio
from pathlib import Path

import pytest

from tokenmill.fleet.config import parse_fleet_config
from tokenmill.fleet.policy import Reason
from tokenmill.fleet.replica import ReplicaProcess
from tokenmill.fleet.router import PoolRuntime, Router, Shed


def _router(max_queue=4, max_queue_s=5.0):
    cfg = parse_fleet_config({
        "pools": [{"name": "economy", "model": "m", "max_concurrency": 4,
                   "hardware": {"name": "cpu", "price_per_hour": 0.5}}],
        "slo_classes": {"interactive": {"ttft_ms": 1500}, "batch": {"max_queue_s": max_queue_s}},
        "tenants": {"a": {"api_key": "A", "slo_class": "interactive"}},
        "max_queue": max_queue})
    replica = ReplicaProcess(cfg.pools[0], 0, Path("/nonexistent"), port=1)
    replica.healthy = True
    return Router(cfg, [PoolRuntime(cfg.pools[0], [replica])])


def test_batch_waits_for_idle_capacity_then_runs():
    async def main():
        router = _router()
        leases = [await router.admit("m", "batch") for _ in range(3)]  # the batch ceiling: 3 of 4 slots
        waiter = asyncio.create_task(router.admit("m", "batch"))
        await asyncio.sleep(0.05)
        assert not waiter.done() and router.waiting["batch"] == 1
        inter = await router.admit("m", "interactive")  # the reserved slot
        assert inter.decision.reason == Reason.CHEAPEST_MEETING_SLO
        router.release(leases[0], service_s=1.0)
        await router.notify()
        await asyncio.sleep(0.05)
        assert not waiter.done()  # 3 in flight again (2 batch + 1 interactive): still no idle slot for batch
        router.release(inter)
        await router.notify()
        lease = await asyncio.wait_for(waiter, 2.0)
        assert lease.decision.reason == Reason.IDLE_CAPACITY and router.waiting["batch"] == 0
        assert router.decisions[("batch", "", "no_idle_capacity")] == 1
        assert router.decisions[("batch", "economy", "idle_capacity")] == 4
    asyncio.run(main())


def test_batch_is_shed_when_its_wait_runs_out_or_the_queue_is_full():
    async def main():
        router = _router(max_queue=1, max_queue_s=0.2)
        for _ in range(3):
            await router.admit("m", "batch")
        first = asyncio.create_task(router.admit("m", "batch"))  # queued
        await asyncio.sleep(0.02)
        with pytest.raises(Shed) as full:
            await router.admit("m", "batch")
        assert full.value.decision.reason == Reason.QUEUE_FULL and full.value.retry_after >= 1
        with pytest.raises(Shed) as late:
            await first
        assert late.value.decision.reason == Reason.QUEUE_TIMEOUT and router.waiting["batch"] == 0
        # interactive still gets in, up to the pool's hard limit (capacity 4 + overflow 4)
        for _ in range(5):
            await router.admit("m", "interactive")
        with pytest.raises(Shed) as over:
            await router.admit("m", "interactive")
        assert over.value.decision.reason == Reason.OVERLOADED
    asyncio.run(main())
