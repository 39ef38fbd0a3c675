"""Elastic P:D: move engines between the prefill and decode pools from the queues the router sees
(pure functions over `InstanceState`s; the router runs `Planner.step` every interval).

A simplification of Dynamo's SLA planner, stated: no profiled per-role throughput curves and no
closed-form replica counts yet; the signal is queue pressure. Prefill pressure = mean requests
waiting on the prefill instances (prompts queued for prefill); decode pressure = mean requests
waiting on the decode instances plus a full KV cache (decodes that cannot be admitted). One
instance moves per decision, towards the pool under pressure, only when the other pool is
relaxed, after `patience` consecutive intervals asking for the same move (hysteresis) and never
within `cooldown` intervals of the previous move; each pool keeps at least one instance. Every
decision carries its reason and the queue figures behind it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenmill.disagg.policy import InstanceState


@dataclass(frozen=True)
class PlannerConfig:
    interval_s: float = 5.0
    high_queue: float = 2.0  # mean waiting requests per instance that means "under pressure"
    low_queue: float = 0.5  # ... and at most this means "relaxed"
    high_kv_usage: float = 0.9  # decode instances this full are under pressure too
    patience: int = 3  # consecutive intervals asking for the same move before it is made
    cooldown: int = 2  # intervals after a move during which no other move is made

    def __post_init__(self) -> None:
        if not 0 <= self.low_queue <= self.high_queue:
            raise ValueError(f"need 0 <= low_queue <= high_queue, got {self.low_queue}, {self.high_queue}")
        if self.patience < 1 or self.cooldown < 0 or self.interval_s <= 0:
            raise ValueError("patience must be >= 1, cooldown >= 0 and interval_s > 0")


@dataclass(frozen=True)
class Decision:
    move: int  # +1: a decode instance becomes prefill; -1: a prefill instance becomes decode; 0: none
    reason: str
    prefill_pressure: float
    decode_pressure: float


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def pressures(prefills: Sequence[InstanceState], decodes: Sequence[InstanceState], cfg: PlannerConfig) -> tuple[float, float]:
    p = _mean([i.num_waiting for i in prefills if i.healthy])
    live = [i for i in decodes if i.healthy]
    d = _mean([i.num_waiting for i in live])
    if any(i.kv_usage >= cfg.high_kv_usage for i in live):
        d = max(d, cfg.high_queue + 1.0)
    return p, d


def wanted_move(prefills: Sequence[InstanceState], decodes: Sequence[InstanceState], cfg: PlannerConfig) -> Decision:
    """The move the current queues ask for (before hysteresis)."""
    p, d = pressures(prefills, decodes, cfg)
    figures = f"prefill waiting {p:.1f}/instance, decode waiting {d:.1f}/instance"
    if p > cfg.high_queue and d <= cfg.low_queue and len(decodes) > 1:
        return Decision(+1, f"prefill pool under pressure, decode relaxed ({figures})", p, d)
    if d > cfg.high_queue and p <= cfg.low_queue and len(prefills) > 1:
        return Decision(-1, f"decode pool under pressure, prefill relaxed ({figures})", p, d)
    return Decision(0, f"balanced ({figures})", p, d)


class Planner:
    """Hysteresis over `wanted_move`: call `step` once per interval."""

    def __init__(self, cfg: PlannerConfig) -> None:
        self.cfg = cfg
        self._streak_move = 0
        self._streak = 0
        self._since_move = cfg.cooldown  # no cooldown at start

    def step(self, prefills: Sequence[InstanceState], decodes: Sequence[InstanceState], load: object = None) -> Decision:
        """`load` (the interval's `IntervalLoad`) is the profile planner's signal; this one reads the queues."""
        want = wanted_move(prefills, decodes, self.cfg)
        self._since_move += 1
        if want.move == 0 or want.move != self._streak_move:
            self._streak_move, self._streak = want.move, (1 if want.move else 0)
        else:
            self._streak += 1
        if want.move == 0 or self._streak < self.cfg.patience or self._since_move <= self.cfg.cooldown:
            return Decision(0, want.reason if want.move == 0 else
                            f"waiting ({self._streak}/{self.cfg.patience}): {want.reason}", want.prefill_pressure,
                            want.decode_pressure)
        self._streak_move, self._streak, self._since_move = 0, 0, 0
        return want


def pick_mover(pool: Sequence[InstanceState]) -> int:
    """The instance to move out of a pool: the least busy healthy one (it has the least to drain)."""
    return min((i for i, inst in enumerate(pool) if inst.healthy), key=lambda i: (pool[i].queue, i))
