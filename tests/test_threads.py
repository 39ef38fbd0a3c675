"""The model's thread budget: affinity and cgroup quota at start, then fewer threads while other
processes keep our cores busy and all of them back when they stop (driven here by fake CPU
readings and a manual clock, so nothing depends on the machine)."""
import os

import torch

from tokenmill.core.clock import ManualClock
from tokenmill.cpu import core_budget
from tokenmill.worker.threads import ThreadController


class FakeCPU:
    """/proc/stat as a script: each look, other processes used `others` cores and we used `mine`."""

    def __init__(self, ticks_per_s: int) -> None:
        self.busy = self.mine = 0
        self.ticks_per_s = ticks_per_s

    def run(self, seconds: float, others: float, mine: float) -> None:
        self.busy += round((others + mine) * seconds * self.ticks_per_s)
        self.mine += round(mine * seconds * self.ticks_per_s)

    def __call__(self, cores):
        return self.busy, self.mine


def test_threads_follow_other_load(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    clock, cpu = ManualClock(), FakeCPU(os.sysconf("SC_CLK_TCK"))
    before = torch.get_num_threads()
    try:
        ctl = ThreadController(2, adaptive=True, interval_s=0.5, clock=clock, read=cpu)
        assert ctl.threads == 2

        def look(others: float, mine: float) -> int:
            clock.advance(1.0)
            cpu.run(1.0, others, mine)
            ctl.before_step()
            return ctl.threads

        assert look(0.0, 2.0) == 2          # idle machine: all cores
        assert look(2.0, 1.0) == 1          # two busy loops beside us: one thread, at once
        assert torch.get_num_threads() == 1
        assert look(1.3, 0.7) == 1          # still loaded
        assert look(0.0, 1.0) == 1          # load gone: one look is not enough to grow
        assert look(0.0, 1.0) == 2          # two looks agree: all cores again
        assert look(0.2, 2.0) == 2          # light load (< 30% of a core) keeps both
        clock.advance(0.1)
        cpu.run(0.1, 2.0, 0.0)
        ctl.before_step()                   # within the interval: no new look
        assert ctl.threads == 2
        assert look(0.6, 1.4) == 2          # part of a core, once: maybe a process finishing
        assert look(0.0, 2.0) == 2
        assert look(0.6, 1.4) == 2          # part of a core, twice in a row: one thread
        assert look(0.7, 1.3) == 1
    finally:
        torch.set_num_threads(before)


def test_a_window_spanning_an_idle_gap_decides_nothing(monkeypatch):
    """Another engine was busy while we were idle and stops as we start (two engines taking turns):
    the first look after the gap only opens a new window; the next one measures the present."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    clock, cpu = ManualClock(), FakeCPU(os.sysconf("SC_CLK_TCK"))
    before = torch.get_num_threads()
    try:
        ctl = ThreadController(2, adaptive=True, interval_s=0.5, clock=clock, read=cpu)
        clock.advance(40.0)
        cpu.run(40.0, 2.0, 0.0)  # 40 s idle while others used both cores
        ctl.before_step()
        assert ctl.threads == 2
        clock.advance(0.6)
        cpu.run(0.6, 0.0, 2.0)   # they stopped: we run alone
        ctl.before_step()
        assert ctl.threads == 2
        clock.advance(30.0)
        cpu.run(30.0, 2.0, 0.0)
        ctl.before_step()        # another gap; this time the load stays
        clock.advance(0.6)
        cpu.run(0.6, 2.0, 0.6)
        ctl.before_step()
        assert ctl.threads == 1
    finally:
        torch.set_num_threads(before)


def test_fixed_thread_count_is_kept(monkeypatch):
    clock, cpu = ManualClock(), FakeCPU(os.sysconf("SC_CLK_TCK"))
    before = torch.get_num_threads()
    try:
        ctl = ThreadController(2, adaptive=False, clock=clock, read=cpu)
        clock.advance(1.0)
        cpu.run(1.0, 2.0, 1.0)
        ctl.before_step()
        assert ctl.threads == 2
    finally:
        torch.set_num_threads(before)


def test_budget_follows_affinity_and_cgroup_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 6})
    monkeypatch.setattr("tokenmill.cpu.cgroup_cpu_limit", lambda: None)
    b = core_budget()
    assert b.threads == 5 and "0-3,6" in b.reason
    monkeypatch.setattr("tokenmill.cpu.cgroup_cpu_limit", lambda: 1.5)
    b = core_budget()
    assert b.threads == 2 and "quota 1.5" in b.reason
    assert core_budget(3).threads == 3 and "--num-threads 3" in core_budget(3).reason
