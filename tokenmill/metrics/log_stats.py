"""LoggingStatLogger: one line every few seconds while the engine is busy, as vLLM logs it:

    INFO 11-30 13:04:05 [log_stats.py:52] Avg prompt throughput: 812.4 tokens/s, Avg generation
    throughput: 96.3 tokens/s, Running: 12 reqs, Waiting: 3 reqs, KV cache usage: 41.2%, Prefix cache
    hit rate: 63.0%, Preemptions: 0

Throughputs are over the interval since the last line; the hit rate is of prompt tokens looked up
in that interval. Silent while idle."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class LoggingStatLogger:
    def __init__(self, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._start = clock()
        self._prompt = self._gen = 0
        self._queries0 = self._hits0 = self._preempt0 = None

    def record(self, sched, it, finished, prefix, evictions) -> None:
        if self._queries0 is None:
            self._queries0, self._hits0, self._preempt0 = prefix.queries, prefix.hits, sched.num_preemptions_total
        self._prompt += it.num_prompt_tokens
        self._gen += it.num_generation_tokens
        now = self.clock()
        elapsed = now - self._start
        if elapsed < self.interval_s:
            return
        if self._prompt or self._gen or sched.num_running or sched.num_waiting:
            queries, hits = prefix.queries - self._queries0, prefix.hits - self._hits0
            logger.info("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                        "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %s, "
                        "Preemptions: %d", self._prompt / elapsed, self._gen / elapsed, sched.num_running,
                        sched.num_waiting, 100 * sched.kv_usage,
                        f"{100 * hits / queries:.1f}%" if queries else "-",
                        sched.num_preemptions_total - self._preempt0)
        self._start, self._prompt, self._gen = now, 0, 0
        self._queries0, self._hits0, self._preempt0 = prefix.queries, prefix.hits, sched.num_preemptions_total
