"""The one place where latencies and cost are derived from the engine's timestamps.

Per request (from `Request.events`, all time.monotonic seconds):
  queue time  = first_scheduled - arrival
  TTFT        = first_token - arrival
  e2e latency = finished - arrival          (last_token when finished is missing)
  TPOT        = (last_token - first_token) / (num_output_tokens - 1)   (needs >= 2 tokens)
  ITL         = gaps between consecutive output-token timestamps

Cost (see `CostWindow`):
  cost per million output tokens [USD] = price_per_hour / 3600 * busy_seconds / output_tokens * 1e6
over a sliding window of the most recent `window_s` seconds of *busy* engine time (the sum of
step times; idle time is not charged, so this is the marginal cost of a token while serving).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from tokenmill.core.kv_cache_manager import PrefixCacheStats
from tokenmill.core.outputs import IterationStats
from tokenmill.core.scheduler import SchedulerStats
from tokenmill.request import Request


class StatLogger(Protocol):
    """Receives, after every engine step (and after aborts), the scheduler's gauges, the step's
    statistics and the requests that ended."""

    def record(self, sched: SchedulerStats, it: IterationStats, finished: list[Request],
               prefix: PrefixCacheStats, evictions: int) -> None: ...


@dataclass
class RequestTimings:
    queue_time: float | None
    ttft: float | None
    e2e: float | None
    tpot: float | None
    itl: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None


def _diff(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max(0.0, later - earlier)


def request_timings(req: Request) -> RequestTimings:
    ev = req.events
    n_out = req.num_output_tokens
    end = ev.finished if ev.finished is not None else ev.last_token
    tpot = None
    if n_out >= 2 and ev.first_token is not None and ev.last_token is not None:
        tpot = max(0.0, ev.last_token - ev.first_token) / (n_out - 1)
    times = ev.token_times
    itl = [max(0.0, b - a) for a, b in zip(times, times[1:])]
    reason = req.finish_reason.value if req.finish_reason is not None else None
    return RequestTimings(queue_time=_diff(ev.first_scheduled, ev.arrival), ttft=_diff(ev.first_token, ev.arrival),
                          e2e=_diff(end, ev.arrival), tpot=tpot, itl=itl,
                          num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=n_out,
                          num_cached_tokens=req.num_cached_tokens, num_preemptions=ev.num_preemptions,
                          finish_reason=reason)


def cost_per_million_tokens(price_per_hour: float, busy_seconds: float, tokens: int) -> float:
    """USD per million tokens when `tokens` took `busy_seconds` of a device billed `price_per_hour`."""
    if tokens <= 0:
        return math.nan
    return price_per_hour / 3600.0 * busy_seconds / tokens * 1e6


class CostWindow:
    """Output throughput over the last `window_s` seconds of busy time, and the cost it implies."""

    def __init__(self, price_per_hour: float, window_s: float = 60.0) -> None:
        if price_per_hour < 0:
            raise ValueError(f"price_per_hour must be >= 0, got {price_per_hour}")
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.price_per_hour = price_per_hour
        self.window_s = window_s
        self._steps: deque[tuple[float, int]] = deque()
        self.busy_seconds = 0.0
        self.tokens = 0

    def add(self, busy_seconds: float, output_tokens: int) -> None:
        if busy_seconds <= 0 and output_tokens <= 0:
            return
        self._steps.append((busy_seconds, output_tokens))
        self.busy_seconds += busy_seconds
        self.tokens += output_tokens
        # drop the oldest steps while what remains still covers the window
        while len(self._steps) > 1 and self.busy_seconds - self._steps[0][0] >= self.window_s:
            s, t = self._steps.popleft()
            self.busy_seconds -= s
            self.tokens -= t

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.busy_seconds if self.busy_seconds > 0 else math.nan

    @property
    def cost_per_million_output_tokens(self) -> float:
        return cost_per_million_tokens(self.price_per_hour, self.busy_seconds, self.tokens)
