"""Switch groups on live router state with fake replicas (an httpx mock answers /sleep and
/wake_up): a request for the sleeping pool waits until the awake pool drains, then the group
sleeps one and wakes the other; after `quantum_s` the awake pool stops taking new requests so the
waiting one gets its turn; a refused sleep (busy engine) leaves everything as it was."""
import asyncio
from pathlib import Path

import httpx
import pytest

from tokenmill.fleet.config import parse_fleet_config
from tokenmill.fleet.policy import Reason
from tokenmill.fleet.replica import ReplicaProcess
from tokenmill.fleet.router import PoolRuntime, Router
from tokenmill.fleet.switching import SwitchGroup


def _setup(quantum_s=10.0, refuse_sleep=False):
    cfg = parse_fleet_config({
        "pools": [{"name": n, "model": n, "max_concurrency": 2, "switch_group": "dev",
                   "hardware": {"name": "cpu", "price_per_hour": 1.0}} for n in ("a", "b")],
        "slo_classes": {"interactive": {"ttft_ms": 1000}},
        "tenants": {"t": {"api_key": "K", "slo_class": "interactive"}},
        "switch_quantum_s": quantum_s})
    pools = []
    for i, p in enumerate(cfg.pools):
        r = ReplicaProcess(p, 0, Path("/nonexistent"), port=9000 + i)
        r.healthy = True
        pools.append(PoolRuntime(p, [r]))
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.port, request.url.path))
        if refuse_sleep and request.url.path == "/sleep":
            return httpx.Response(409, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={})

    router = Router(cfg, pools)
    group = SwitchGroup("dev", pools, cfg.switch_quantum_s)
    router.groups = {p.name: group for p in pools}
    router.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return router, group, calls


def test_a_request_for_the_sleeping_pool_waits_for_the_switch():
    async def main():
        router, group, calls = _setup()
        a = await router.admit("a", "interactive")
        waiter = asyncio.create_task(router.admit("b", "interactive"))
        await asyncio.sleep(0.05)
        assert not waiter.done() and calls == []  # a still has a request in flight
        assert router.decisions[("interactive", "b", Reason.WAITS_FOR_SWITCH.value)] == 1
        router.release(a)
        await router.notify()
        lease = await asyncio.wait_for(waiter, 2.0)
        assert lease.pool.name == "b" and group.awake == "b" and group.switches == 1
        assert calls == [(9000, "/sleep"), (9001, "/wake_up")]
        assert group.waiting_since == {"a": [], "b": []}
    asyncio.run(main())


def test_after_the_quantum_the_awake_pool_drains_for_the_waiting_one():
    async def main():
        router, group, _ = _setup(quantum_s=0.1)
        first = await router.admit("a", "interactive")
        waiter_b = asyncio.create_task(router.admit("b", "interactive"))
        await asyncio.sleep(0.02)
        assert group.admits("a")  # within the quantum a still takes requests
        second = await router.admit("a", "interactive")
        await asyncio.sleep(0.15)
        assert not group.admits("a")  # b has waited past the quantum: a takes no more
        late_a = asyncio.create_task(router.admit("a", "interactive"))
        await asyncio.sleep(0.05)
        assert not late_a.done() and not waiter_b.done()
        for lease in (first, second):
            router.release(lease)
        await router.notify()
        assert (await asyncio.wait_for(waiter_b, 2.0)).pool.name == "b"
        assert not late_a.done()  # now a waits for its turn
        late_a.cancel()
    asyncio.run(main())


def test_a_refused_sleep_keeps_the_awake_pool():
    async def main():
        router, group, calls = _setup(refuse_sleep=True)
        waiter = asyncio.create_task(router.admit("b", "interactive"))
        await asyncio.sleep(0.1)
        assert not waiter.done() and group.awake == "a" and (9000, "/wake_up") in calls
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert group.waiting_since["b"] == []
    asyncio.run(main())


def test_a_group_of_one_is_refused():
    with pytest.raises(ValueError, match=r"switch_group \['solo'\] has a single pool"):
        parse_fleet_config({"pools": [{"name": "a", "model": "a", "switch_group": "solo",
                                       "hardware": {"name": "cpu", "price_per_hour": 1.0}}],
                            "slo_classes": {"c": {}}, "tenants": {"t": {"api_key": "K", "slo_class": "c"}}})
