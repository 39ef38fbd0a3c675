"""Facts about the CPU this process runs on (torch-free): instruction-set flags, memory, and the
cores it may use."""
from __future__ import annotations

import functools
import os


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


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))
