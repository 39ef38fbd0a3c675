"""Pools that take turns on one device: a switch group (the fleet's option (c), beside
time-slicing and spatial partitioning).

The pools of a group (`switch_group: NAME` in their config) hold their weights in host memory all
the time, but only one of them is awake: the others' engines sleep (vLLM's sleep mode, level 1:
KV cache released). A request for a sleeping pool waits; once the awake pool has nothing in flight
the group puts it to sleep (`POST /sleep` on its replicas) and wakes the pool that has waited
longest (`POST /wake_up`). So the awake pool is not held forever by a steady stream, it stops
taking new requests once another pool has waited `quantum_s` (counted from when the awake pool
woke up, so each turn lasts at least a quantum), and drains.
"""
from __future__ import annotations

import asyncio
import logging
import time

import httpx

from tokenmill.fleet.router import PoolRuntime

logger = logging.getLogger(__name__)


class SwitchGroup:
    def __init__(self, name: str, pools: list[PoolRuntime], quantum_s: float) -> None:
        self.name = name
        self.pools = {p.name: p for p in pools}
        self.awake = pools[0].name
        self.quantum_s = quantum_s
        self.waiting_since: dict[str, list[float]] = {p.name: [] for p in pools}  # arrival times of waiters
        self.switching = False
        self.awake_since = time.monotonic()  # a waiter's quantum counts from here at the earliest
        self.switches = 0
        self.switch_seconds = 0.0

    def admits(self, pool: str, now: float | None = None) -> bool:
        """May a request go to `pool` now, without waiting for a switch?"""
        if self.switching or pool != self.awake:
            return False
        now = time.monotonic() if now is None else now
        return not any(waits and now - max(min(waits), self.awake_since) >= self.quantum_s
                       for name, waits in self.waiting_since.items() if name != pool)

    def next_pool(self) -> str | None:
        """The sleeping pool whose request has waited longest, if any waits."""
        waiting = [(min(w), name) for name, w in self.waiting_since.items() if w and name != self.awake]
        return min(waiting)[1] if waiting else None

    def can_switch(self) -> bool:
        return not self.switching and sum(self.pools[self.awake].in_flight.values()) == 0 \
            and self.next_pool() is not None

    async def switch(self, client: httpx.AsyncClient) -> bool:
        """Sleep the awake pool, wake the longest-waiting one. False if an engine refused (busy)."""
        target = self.next_pool()
        if target is None or not self.can_switch():
            return False
        self.switching = True
        start = time.monotonic()
        try:
            current = self.pools[self.awake]
            if not await _all_ok(client, current, "/sleep"):
                await _all_ok(client, current, "/wake_up")
                return False
            if not await _all_ok(client, self.pools[target], "/wake_up"):
                await _all_ok(client, current, "/wake_up")
                return False
            logger.info("switch group %s: %s asleep, %s awake (%.3f s)", self.name, self.awake, target,
                        time.monotonic() - start)
            self.awake = target
            self.awake_since = time.monotonic()
            self.switches += 1
            self.switch_seconds += time.monotonic() - start
            return True
        finally:
            self.switching = False

    async def sleep_all_but_first(self, client: httpx.AsyncClient) -> None:
        """At start: every pool but the awake one goes to sleep."""
        for name, pool in self.pools.items():
            if name != self.awake and not await _all_ok(client, pool, "/sleep"):
                raise RuntimeError(f"switch group {self.name}: pool {name} would not sleep")


async def _all_ok(client: httpx.AsyncClient, pool: PoolRuntime, path: str) -> bool:
    try:
        rs = await asyncio.gather(*(client.post(r.url + path, timeout=60.0) for r in pool.healthy()))
    except httpx.HTTPError:
        return False
    return all(r.status_code == 200 for r in rs)
