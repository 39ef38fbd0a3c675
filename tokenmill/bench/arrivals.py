"""When the benchmark sends each request: gamma-distributed gaps around a rate (Poisson at CV 1,
bursty above, evenly spaced at 0, all at once at an infinite rate), or a trace's own timestamps."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenmill.bench.workloads import BenchRequest


def arrival_offsets(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (seconds from the start) of n requests; the first goes at 0.

    Inter-arrival times are gamma with shape 1/cv**2 and mean 1/rate (cv=1: Poisson).
    """
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if cv == 0:
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def trace_offsets(requests: list[BenchRequest]) -> np.ndarray:
    return np.array([r.timestamp or 0.0 for r in requests], dtype=float)
