"""Facts about the CPU this process runs on (torch-free): instruction-set flags, memory, the cores
it may use (affinity and cgroup quota), and how busy other processes keep them."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def isa_flags() -> list[str]:
    """The instruction-set flags our kernels dispatch on (avx2, fma, avx512*, amx*), sorted."""
    return sorted(f for f in cpu_flags() if f in ("avx2", "fma") or f.startswith(("avx512", "amx")))


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """`model name (family F model M)` from /proc/cpuinfo: "AMD EPYC" alone hides Zen 1 vs Zen 4."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    name = fields.get("model name", "unknown CPU")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def cpu_has_bf16() -> bool:
    return "avx512_bf16" in cpu_flags()


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def cgroup_cpu_limit() -> float | None:
    """The CPU quota of this process's cgroup in cores (cgroup v2 cpu.max, or v1
    cfs_quota_us / cfs_period_us), None when unlimited or unknown."""
    for path in ("/sys/fs/cgroup/cpu.max",):
        try:
            quota, period = open(path).read().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            pass
    try:
        quota = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read())
        period = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class CoreBudget:
    """How many threads the model should use, and why (for the startup log)."""
    threads: int
    reason: str


def core_budget(requested: int | None = None) -> CoreBudget:
    cores = sorted(os.sched_getaffinity(0))
    if requested is not None:
        return CoreBudget(requested, f"--num-threads {requested}")
    quota = cgroup_cpu_limit()
    threads = len(cores)
    reason = f"{len(cores)} cores in this process's CPU affinity ({_ranges(cores)})"
    if quota is not None and math.ceil(quota) < threads:
        threads = max(1, math.ceil(quota))
        reason += f", cgroup CPU quota {quota:g} cores"
    return CoreBudget(threads, reason)


def _ranges(cores: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def busy_jiffies(cores: set[int]) -> int:
    """Busy time (user, nice, system, irq, softirq, steal) of the given CPUs since boot, in clock
    ticks, from /proc/stat; 0 if unreadable."""
    total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                parts = line.split()
                if int(parts[0][3:]) in cores:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, parts[1:9])
                    total += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return 0
    return total


def self_jiffies() -> int:
    """CPU time of this process (all threads) and of its finished children (e.g. the compiler that
    built our kernels), in clock ticks."""
    t = os.times()
    return round((t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK"))
