"""The fleet's live routing state and admission: which replica a request goes to, now or after
waiting, or a 429.

Each pool keeps, per replica, the requests the fleet has in flight there, and recent (EWMA) TTFT,
TPOT and service time from finished requests (the engine's own TTFT/TPOT from the response's usage
extension). `Router.admit` asks the pure policy (`policy.choose_pool`) with a snapshot of every
pool; a best-effort request told to wait sleeps until a request finishes anywhere, then asks again,
until its class's max_queue_s (then 429). A request routed to a sleeping pool of a switch group
waits for that pool's turn, switching the group itself once the awake pool has drained
(switching.py). Every decision is counted with its reason (a wait once per request).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from tokenmill.fleet.config import FleetConfig, Pool
from tokenmill.fleet.latency_model import LoadLatencyModel
from tokenmill.fleet.policy import (Action, Decision, PoolLoad, Reason, RouterLimits, Targets, choose_pool,
                                    retry_after_s)
from tokenmill.fleet.replica import Replica

if TYPE_CHECKING:
    from tokenmill.fleet.switching import SwitchGroup

EWMA_ALPHA = 0.2
SWITCH_RECHECK_S = 0.25


def _ewma(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * new


@dataclass
class PoolRuntime:
    config: Pool
    replicas: list[Replica]
    in_flight: dict[str, int] = field(default_factory=dict)  # replica name -> requests
    ttft_s: float | None = None  # EWMA of recent requests
    tpot_s: float | None = None
    service_s: float | None = None
    prediction: str = "load"  # "load": latency_model.py (TTFT/TPOT vs requests in flight); "ewma"
    ttft_model: LoadLatencyModel = field(default_factory=LoadLatencyModel)
    tpot_model: LoadLatencyModel = field(default_factory=LoadLatencyModel)

    @property
    def name(self) -> str:
        return self.config.name

    def healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.healthy]

    def load(self) -> PoolLoad:
        """The pool now; ttft_s / tpot_s: what a request admitted now is predicted to see."""
        n = sum(self.in_flight.values())
        ttft, tpot = self.ttft_s, self.tpot_s
        if self.prediction == "load":
            per_replica = (n + 1) / max(1, len(self.healthy()))  # the least loaded replica takes it
            ttft, tpot = self.ttft_model.predict(per_replica), self.tpot_model.predict(per_replica)
        return PoolLoad(self.name, self.config.model_label, self.config.hardware.price_per_hour,
                        len(self.healthy()), self.config.max_concurrency, n, ttft, tpot, self.service_s,
                        tuple(self.config.served_models))

    def pick_replica(self) -> Replica:
        return min(self.healthy(), key=lambda r: (self.in_flight.get(r.name, 0), r.index))

    def observe(self, ttft_s: float | None, tpot_s: float | None, service_s: float | None,
                load: float = 1.0) -> None:
        """A request finished; `load`: the requests in flight on its replica when it was admitted."""
        self.ttft_s = _ewma(self.ttft_s, ttft_s)
        self.tpot_s = _ewma(self.tpot_s, tpot_s)
        self.service_s = _ewma(self.service_s, service_s)
        self.ttft_model.observe(load, ttft_s)
        self.tpot_model.observe(load, tpot_s)


@dataclass
class Lease:
    """A request's place on a replica, held until it finishes."""
    pool: PoolRuntime
    replica: Replica
    decision: Decision
    queued_s: float = 0.0
    model: str = ""  # the request's model (a pool may hold several)
    load: int = 1  # requests in flight on its replica when it was admitted, itself included


class Shed(Exception):
    def __init__(self, decision: Decision, retry_after: int) -> None:
        super().__init__(decision.reason.value)
        self.decision = decision
        self.retry_after = retry_after


class Router:
    def __init__(self, config: FleetConfig, pools: list[PoolRuntime], limits: RouterLimits = RouterLimits(),
                 on_decision: Callable[[str, Decision], None] | None = None) -> None:
        self.config = config
        self.on_decision = on_decision
        self.pools = {p.name: p for p in pools}
        for p in pools:
            p.prediction = config.latency_prediction
        self.limits = limits
        self.targets = {name: Targets(c.ttft_ms / 1e3 if c.ttft_ms else None, c.tpot_ms / 1e3 if c.tpot_ms else None)
                        for name, c in config.slo_classes.items()}
        self.waiting: Counter[str] = Counter()  # SLO class -> requests waiting in the fleet's queue
        self.decisions: Counter[tuple[str, str, str]] = Counter()  # (slo_class, pool or "", reason)
        self._changed = asyncio.Condition()
        self.groups: dict[str, SwitchGroup] = {}  # pool name -> its switch group (set by the runtime)
        self.client: httpx.AsyncClient | None = None  # for switching (set by the runtime)

    def loads(self) -> list[PoolLoad]:
        return [p.load() for p in self.pools.values()]

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting.values())

    async def admit(self, model: str, slo_class: str) -> Lease:
        targets = self.targets[slo_class]
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.config.slo_classes[slo_class].max_queue_s
        queued = False
        turn: tuple[SwitchGroup, str, float] | None = None  # waiting for a sleeping pool's turn
        try:
            while True:
                has_room = queued or self.num_waiting < self.config.max_queue
                d = choose_pool(model, targets, self.loads(), self.limits, queue_has_room=has_room)
                if d.action == Action.ROUTE:
                    group = self.groups.get(d.pool)
                    if group is None or group.admits(d.pool):
                        self._count(slo_class, d)
                        return self._lease(d, loop.time() - start, model)
                    if turn is None or turn[1] != d.pool:
                        self._leave_turn(turn)
                        turn = (group, d.pool, time.monotonic())
                        group.waiting_since[d.pool].append(turn[2])
                        self._count(slo_class, Decision(Action.WAIT, Reason.WAITS_FOR_SWITCH, d.pool))
                    if group.can_switch() and await group.switch(self.client):
                        await self.notify()
                    else:
                        await self._wait_change(SWITCH_RECHECK_S)  # the quantum may run out meanwhile
                    continue
                if d.action == Action.SHED:
                    self._count(slo_class, d)
                    raise Shed(d, retry_after_s(self.loads(), model))
                if not queued:
                    self._count(slo_class, d)
                    self.waiting[slo_class] += 1
                    queued = True
                if not await self._wait_change(deadline - loop.time()):
                    d = Decision(Action.SHED, Reason.QUEUE_TIMEOUT)
                    self._count(slo_class, d)
                    raise Shed(d, retry_after_s(self.loads(), model))
        finally:
            if queued:
                self.waiting[slo_class] -= 1
            self._leave_turn(turn)

    @staticmethod
    def _leave_turn(turn: tuple[SwitchGroup, str, float] | None) -> None:
        if turn is not None:
            turn[0].waiting_since[turn[1]].remove(turn[2])

    async def _wait_change(self, timeout: float) -> bool:
        if timeout <= 0:
            return False
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
                return True
            except asyncio.TimeoutError:
                return False

    def _lease(self, d: Decision, queued_s: float, model: str = "") -> Lease:
        pool = self.pools[d.pool]
        replica = pool.pick_replica()
        pool.in_flight[replica.name] = pool.in_flight.get(replica.name, 0) + 1
        return Lease(pool, replica, d, queued_s, model, pool.in_flight[replica.name])

    def _count(self, slo_class: str, d: Decision) -> None:
        self.decisions[(slo_class, d.pool or "", d.reason.value)] += 1
        if self.on_decision is not None:
            self.on_decision(slo_class, d)

    def release(self, lease: Lease, ttft_s: float | None = None, tpot_s: float | None = None,
                service_s: float | None = None) -> None:
        """The request left its replica (synchronous, so a cancelled caller cannot lose it); then
        `notify()` wakes the waiting requests."""
        pool = lease.pool
        pool.in_flight[lease.replica.name] -= 1
        pool.observe(ttft_s, tpot_s, service_s, lease.load)

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
