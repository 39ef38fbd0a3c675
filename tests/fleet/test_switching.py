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


def test_live_switch_group_takes_turns(tiny_llama, tmp_path):
    """Two tiny-model pools in one switch group behind a real fleet: requests alternate between the
    models, each served after a switch; the sleeping replica says so on /is_sleeping."""
    from e2e_helpers import TINY_CHAT_TEMPLATE
    from fleet_helpers import run_fleet
    from test_fleet_e2e import series
    engine = {"dtype": "float32", "kv_cache_memory_gb": 0.02, "num_threads": 1, "chat_template": TINY_CHAT_TEMPLATE}
    config = {"pools": [{"name": f"p{i}", "model": f"t{i}", "path": str(tiny_llama), "switch_group": "dev",
                         "hardware": {"name": "cpu", "price_per_hour": 1.0}, "engine": engine} for i in (1, 2)],
              "slo_classes": {"interactive": {"ttft_ms": 5000}},
              "tenants": {"acme": {"api_key": "KEY_A", "slo_class": "interactive"}},
              "ledger": str(tmp_path / "ledger.sqlite"), "switch_quantum_s": 0.2}
    gen = run_fleet(config, tmp_path)
    fleet = next(gen)
    try:
        async def traffic():
            async with httpx.AsyncClient(base_url=fleet.url, headers={"Authorization": "Bearer KEY_A"},
                                         timeout=60) as c:
                rs = await asyncio.gather(*(c.post("/v1/completions", json={"model": m, "prompt": f"hi {i}",
                                                                            "max_tokens": 3})
                                            for i, m in enumerate(["t1", "t2"] * 4)))
                return [(r.status_code, r.headers.get("x-tokenmill-pool")) for r in rs]
        got = asyncio.run(traffic())
        assert sorted(got) == [(200, "p1")] * 4 + [(200, "p2")] * 4
        text = fleet.metrics()
        assert series(text, "tokenmill:fleet_switch_group_switches", group="dev") >= 1
        assert series(text, "tokenmill:fleet_pool_awake") == 1.0
        data = fleet.data()
        sleeping = [httpx.get(r["url"] + "/is_sleeping").json()["is_sleeping"]
                    for p in data["pools"] for r in p["replicas"]]
        assert sorted(sleeping) == [False, True]
    finally:
        next(gen, None)


def test_each_turn_lasts_a_quantum_however_long_the_others_waited():
    """No thrashing: requests that waited through the previous turn do not cut the new one short."""
    _, group, _ = _setup(quantum_s=1.0)
    group.awake, group.awake_since = "b", 100.0
    group.waiting_since["a"].append(50.0)  # waited 50 s through a's drain and the switch
    assert group.admits("b", now=100.5)
    assert not group.admits("b", now=101.0)
