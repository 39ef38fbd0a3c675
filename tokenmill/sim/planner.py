"""The planner's search, independent of what evaluates a configuration (the simulator in
`tokenmill plan`, a synthetic cost surface in tests).

A *structure* is everything but the replica count (device, TP, P:D ratio, batch budget, KV budget
and dtype, weight dtype). For each structure the planner finds the fewest replica units that meet
the SLO (doubling, then bisection: SLO attainment only improves with more replicas), and ranks the
structures' cheapest feasible points by price per hour.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

_SLO_TERM = re.compile(r"^(ttft|tpot|e2e|itl)_p(\d+(?:\.\d+)?)\s*<=\s*([\d.]+)\s*(ms|s)$")


@dataclass(frozen=True)
class SLOTerm:
    metric: str  # ttft | tpot | e2e | itl
    percentile: float
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_ms.p{self.percentile:g}"

    def __str__(self) -> str:
        return f"{self.metric}_p{self.percentile:g}<={self.limit_ms:g}ms"


def parse_slo(text: str) -> list[SLOTerm]:
    """'ttft_p99<=2s,tpot_p99<=100ms' -> terms; a bad term is an error naming it and the form."""
    terms = []
    for raw in (t.strip() for t in text.split(",") if t.strip()):
        m = _SLO_TERM.match(raw.replace(" ", ""))
        if not m:
            raise ValueError(f"--slo: cannot read {raw!r}; write METRIC_pN<=LIMIT with METRIC one of ttft, tpot, "
                             "e2e, itl and LIMIT in ms or s, e.g. ttft_p99<=2s,tpot_p99<=100ms")
        metric, pct, value, unit = m.groups()
        if not 0 < float(pct) <= 100:
            raise ValueError(f"--slo: percentile of {raw!r} must be in (0, 100]")
        terms.append(SLOTerm(metric, float(pct), float(value) * (1000.0 if unit == "s" else 1.0)))
    if not terms:
        raise ValueError("--slo needs at least one term, e.g. ttft_p99<=2s")
    return terms


@dataclass
class Evaluation:
    structure: Hashable
    units: int  # replica units (a unit of a P:D structure is its whole ratio)
    price_per_hour: float
    meets: bool
    metrics: dict[str, Any] = field(default_factory=dict)


Evaluate = Callable[[Hashable, int], Evaluation]


def cheapest_units(structure: Hashable, evaluate: Evaluate, max_units: int) -> tuple[Evaluation | None, list[Evaluation]]:
    """The fewest units of `structure` meeting the SLO (None if even `max_units` fail), and every
    evaluation made on the way."""
    seen: dict[int, Evaluation] = {}

    def ev(n: int) -> Evaluation:
        if n not in seen:
            seen[n] = evaluate(structure, n)
        return seen[n]

    lo, hi = 0, 1  # lo fails (0 trivially), hi is the next to try
    while not ev(hi).meets:
        lo = hi
        if hi >= max_units:
            return None, list(seen.values())
        hi = min(2 * hi, max_units)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ev(mid).meets:
            hi = mid
        else:
            lo = mid
    return seen[hi], list(seen.values())


def search(structures: Sequence[Hashable], evaluate: Evaluate, max_units: int = 64,
           ) -> tuple[list[Evaluation], list[Evaluation]]:
    """(feasible cheapest point of each structure, by price per hour; every evaluation made)."""
    best, everything = [], []
    for s in structures:
        found, evals = cheapest_units(s, evaluate, max_units)
        everything += evals
        if found is not None:
            best.append(found)
    best.sort(key=lambda e: (e.price_per_hour, -e.metrics.get("goodput_per_dollar", 0.0)))
    return best, everything
