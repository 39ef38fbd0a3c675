"""SLA-class routing as pure functions over snapshots of the pools (unit-tested on fake states).

A request of an SLO class with targets goes to the cheapest pool serving its model whose predicted
TTFT and TPOT meet the class's targets; if none is predicted to, to the best available one (the
lowest predicted TTFT). A best-effort class (no targets, e.g. `batch`) only takes idle capacity —
a free slot below the pool's batch ceiling, which keeps `reserve` of each pool for classes with
targets — and otherwise waits in the fleet's queue. Under overload the shedding order follows:
best effort is shed first (its queue is bounded and it never overflows a pool), classes with
targets only when every pool serving the model is at its hard limit (capacity + overflow).

Prediction (from the pool's live numbers): TTFT = the pool's recent TTFT + the wait for a free slot
(requests beyond capacity / capacity × recent service time); TPOT = the pool's recent TPOT. A pool
with no observations yet is predicted to meet any target (it gets traffic, hence numbers).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class PoolLoad:
    """What the router knows about one pool at one moment."""
    name: str
    model: str
    price_per_hour: float  # of one replica
    replicas: int  # healthy ones
    max_concurrency: int  # per replica
    in_flight: int  # requests sent to the pool and not finished
    ttft_s: float | None = None  # recent TTFT at the pool (EWMA); None: not observed yet
    tpot_s: float | None = None
    service_s: float | None = None  # recent time a request holds a slot (EWMA)
    models: tuple[str, ...] = ()  # a pool holding several models (one process each): all of them

    def serves(self, model: str) -> bool:
        return model in self.models if self.models else model == self.model

    @property
    def capacity(self) -> int:
        return self.replicas * self.max_concurrency

    @property
    def price(self) -> float:
        return self.price_per_hour * self.replicas


@dataclass(frozen=True)
class Targets:
    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def best_effort(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None


@dataclass(frozen=True)
class RouterLimits:
    reserve: float = 0.25  # share of each pool's slots best-effort traffic may not take
    overflow: float = 1.0  # beyond capacity, classes with targets may queue this share more in the engines


class Action(str, Enum):
    ROUTE = "route"
    WAIT = "wait"
    SHED = "shed"


class Reason(str, Enum):
    CHEAPEST_MEETING_SLO = "cheapest_meeting_slo"
    BEST_AVAILABLE = "best_available"
    IDLE_CAPACITY = "idle_capacity"
    NO_IDLE_CAPACITY = "no_idle_capacity"  # best effort waits
    QUEUE_FULL = "queue_full"  # best effort shed: the fleet's queue is full
    QUEUE_TIMEOUT = "queue_timeout"  # best effort shed: waited its class's max_queue_s
    OVERLOADED = "overloaded"  # every pool serving the model is at its hard limit
    NO_POOL = "no_pool"  # no healthy replica serves the model
    WAITS_FOR_SWITCH = "waits_for_switch"  # its pool sleeps in a switch group: waits for its turn


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: Reason
    pool: str | None = None
    predicted_ttft_s: float | None = None
    predicted_tpot_s: float | None = None


def predict_ttft(pool: PoolLoad) -> float | None:
    if pool.ttft_s is None:
        return None
    beyond = pool.in_flight + 1 - pool.capacity
    wait = beyond / pool.capacity * (pool.service_s or 0.0) if beyond > 0 and pool.capacity else 0.0
    return pool.ttft_s + wait


def meets(pool: PoolLoad, targets: Targets) -> bool:
    ttft = predict_ttft(pool)
    if targets.ttft_s is not None and ttft is not None and ttft > targets.ttft_s:
        return False
    return not (targets.tpot_s is not None and pool.tpot_s is not None and pool.tpot_s > targets.tpot_s)


def hard_limit(pool: PoolLoad, limits: RouterLimits) -> int:
    return pool.capacity + int(pool.capacity * limits.overflow)


def batch_ceiling(pool: PoolLoad, limits: RouterLimits) -> int:
    """Slots best-effort traffic may fill (at least one per pool, so batch is never starved of an idle pool)."""
    return max(1, int(pool.capacity * (1.0 - limits.reserve))) if pool.capacity else 0


def _load(pool: PoolLoad) -> float:
    return pool.in_flight / pool.capacity if pool.capacity else float("inf")


def choose_pool(model: str, targets: Targets, pools: list[PoolLoad], limits: RouterLimits = RouterLimits(),
                queue_has_room: bool = True) -> Decision:
    """Where a request of this model and class goes now (or whether it waits or is shed)."""
    serving = [p for p in pools if p.serves(model) and p.replicas > 0]
    if not serving:
        return Decision(Action.SHED, Reason.NO_POOL)
    if targets.best_effort:
        return _best_effort(serving, limits, queue_has_room)
    open_pools = [p for p in serving if p.in_flight < hard_limit(p, limits)]
    if not open_pools:
        return Decision(Action.SHED, Reason.OVERLOADED)
    meeting = [p for p in open_pools if meets(p, targets)]
    if meeting:
        best = min(meeting, key=lambda p: (p.price_per_hour, _load(p), p.name))
        return _route(best, Reason.CHEAPEST_MEETING_SLO)
    best = min(open_pools, key=lambda p: (predict_ttft(p) or 0.0, _load(p), p.price_per_hour, p.name))
    return _route(best, Reason.BEST_AVAILABLE)


def _best_effort(serving: list[PoolLoad], limits: RouterLimits, queue_has_room: bool) -> Decision:
    idle = [p for p in serving if p.in_flight < batch_ceiling(p, limits)]
    if idle:
        return _route(min(idle, key=lambda p: (p.price_per_hour, _load(p), p.name)), Reason.IDLE_CAPACITY)
    if not queue_has_room:
        return Decision(Action.SHED, Reason.QUEUE_FULL)
    return Decision(Action.WAIT, Reason.NO_IDLE_CAPACITY)


def _route(pool: PoolLoad, reason: Reason) -> Decision:
    return Decision(Action.ROUTE, reason, pool.name, predict_ttft(pool), pool.tpot_s)


def retry_after_s(pools: list[PoolLoad], model: str) -> int:
    """Seconds a shed client should wait: about one service time of the model's pools (1..60)."""
    times = [p.service_s for p in pools if p.serves(model) and p.service_s]
    return int(min(60, max(1, round(min(times))))) if times else 1
