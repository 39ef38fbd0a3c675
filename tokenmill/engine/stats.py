"""What the engine reports each step; metrics/ turns it into Prometheus series and cost."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenmill.core.kv_cache_manager import PrefixCacheStats
from tokenmill.core.scheduler import SchedulerStats
from tokenmill.request import Request


@dataclass
class IterationStats:
    num_prompt_tokens: int
    num_generation_tokens: int
    num_batched_tokens: int
    num_seqs: int
    num_preempted: int
    schedule_time: float
    forward_time: float
    step_time: float


class StatLogger(Protocol):
    def record(self, sched: SchedulerStats, it: IterationStats, finished: list[Request],
               prefix: PrefixCacheStats, evictions: int) -> None: ...
