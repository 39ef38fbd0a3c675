"""The model's thread count follows what the CPU can give it now.

Our threads (torch's OpenMP pool, which runs our kernels too) wait for each other at the end of
every parallel region. When another process keeps one of our cores busy, the thread on that core
gets a fraction of it, every region waits for that thread, and the step slows by far more than the
fair share (measured in docs/BENCHMARKS.md, "Sharing the CPU"). So before each step, at most every
`interval_s`, the controller measures how much of our cores other processes used since the last
look (/proc/stat busy time of our cores minus our own CPU time) and runs as many threads as there
are cores left: fewer under contention (at once when others use a whole core or more; for less,
when two looks in a row agree), back to all of them when it ends (after two looks in a row agree),
so a short burst does not make it flap. A count the user fixed (--num-threads) is kept.
A look after an idle gap (no step for several intervals) only starts a new window: what other
processes did while we were idle says little about now (two engines taking turns, or a benchmark
alternating with another engine, would otherwise start every busy period on one thread).
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import torch

from tokenmill.cpu import busy_jiffies, self_jiffies

logger = logging.getLogger(__name__)

_HEADROOM = 0.3  # a core counts as free if others use less than 70% of it
_CLEAR_LOAD = 1.0  # others using a whole core or more: fewer threads at once, else after two looks
_STALE_INTERVALS = 4  # a window longer than this many intervals spans an idle gap: start a new one


def read_cpu_use(cores: set[int]) -> tuple[int, int]:
    """(busy ticks of `cores` since boot, this process's CPU ticks)."""
    return busy_jiffies(cores), self_jiffies()


class ThreadController:
    def __init__(self, max_threads: int, adaptive: bool, interval_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic,
                 read: Callable[[set[int]], tuple[int, int]] = read_cpu_use) -> None:
        self.cores = set(os.sched_getaffinity(0))
        self.max_threads = max_threads
        self.adaptive = adaptive
        self.interval_s = interval_s
        self.clock = clock
        self.read = read
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.threads = max_threads
        self._want_more = self._want_fewer = False
        torch.set_num_threads(max_threads)
        self._last = (clock(), *read(self.cores))

    def before_step(self) -> None:
        if not self.adaptive or self.max_threads == 1:
            return
        now = self.clock()
        elapsed = now - self._last[0]
        if elapsed < self.interval_s:
            return
        busy, mine = self.read(self.cores)
        others = max(0, (busy - self._last[1]) - (mine - self._last[2])) / (elapsed * self.ticks_per_s)
        self._last = (now, busy, mine)
        if elapsed > _STALE_INTERVALS * self.interval_s:
            return
        self._apply(max(1, min(self.max_threads, math.floor(len(self.cores) - others + _HEADROOM))), others)

    def _apply(self, target: int, others: float) -> None:
        more, fewer = target > self.threads, target < self.threads and others < _CLEAR_LOAD
        if (more and not self._want_more) or (fewer and not self._want_fewer):
            # grow only when two looks in a row agree; shrink so too when others use part of a core
            # (maybe another process finishing its work)
            self._want_more, self._want_fewer = more, fewer
            return
        self._want_more = self._want_fewer = False
        if target != self.threads:
            logger.info("model threads %d -> %d (other processes use %.1f of %d cores)", self.threads, target,
                        others, len(self.cores))
            self.threads = target
            torch.set_num_threads(target)
