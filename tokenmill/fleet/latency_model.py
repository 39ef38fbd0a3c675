"""A pool's latency as a function of its load: TTFT (or TPOT) ≈ a + b·n, where n is the number of
requests the fleet had in flight on the pool when the request was admitted (itself included).

The fleet routes by what a request admitted *now* will see, and on a CPU (or a GPU at high batch)
that grows with the requests already running: each step carries their decodes, and queued
prefills wait. A plain moving average of recent TTFTs (the first router) only learns it after the
slow requests finish — the interactive requests routed meanwhile miss their targets. Here the
line is fitted by exponentially weighted least squares over recent requests (a forgetting factor,
so the fit follows the machine), the slope kept ≥ 0 (more load never makes a request faster), and
the prediction reacts at once to the pool's live in-flight count. With too little spread in n to
fit a slope, the latency is taken as proportional to the load above the observed mean (and flat
below it): pessimistic only where there are no observations.
"""
from __future__ import annotations

from dataclasses import dataclass

FORGET = 0.05  # weight of each new observation (~20 recent requests dominate)
MIN_VARIANCE = 0.25  # of n, below which no slope is fitted


@dataclass
class LoadLatencyModel:
    forget: float = FORGET
    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, n: float, y: float | None) -> None:
        if y is None:
            return
        keep = 1.0 - self.forget
        self.w = self.w * keep + 1.0
        self.sx = self.sx * keep + n
        self.sy = self.sy * keep + y
        self.sxx = self.sxx * keep + n * n
        self.sxy = self.sxy * keep + n * y

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) of the fitted line, None before any observation or without spread in n."""
        if self.w == 0.0:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if var < MIN_VARIANCE:
            return None
        b = max(0.0, (self.sxy / self.w - mx * my) / var)
        return my - b * mx, b

    def predict(self, n: float) -> float | None:
        if self.w == 0.0:
            return None
        line = self.coefficients()
        mx, my = self.sx / self.w, self.sy / self.w
        if line is None:
            return my * max(1.0, n / mx) if mx > 0 else my
        a, b = line
        return max(0.0, a + b * n)
