"""The SLOs that goodput is measured against: each flag (`--slo-ttft-ms`, `--slo-tpot-ms`,
`--slo-e2e-ms`) if given, else the workload's default from `DEFAULT_SLOS`.

The defaults suit our reference setup, SmolLM2-135M on a 2-core CPU (docs/SERVE_BENCH.md): an idle
machine meets them, a loaded one starts to miss them. On faster hardware, set tighter ones.
No default E2E SLO: output lengths vary within every workload, so one end-to-end limit would be a
different target for each request; TTFT and TPOT bound each request's E2E anyway
(E2E ~ TTFT + TPOT x (output tokens - 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tokenmill.bench.metrics import SLO
from tokenmill.bench.workloads import WORKLOADS, BenchError

TRACE = "trace"  # the defaults' key for a JSONL trace (any --workload not in WORKLOADS)
OFF = "off"  # an SLO flag's value that turns that SLO off, default included

# workload -> default SLO (ms). Why each value:
DEFAULT_SLOS: dict[str, SLO] = {
    # interactive: the reply starts within 2 s and streams at >= 5 tokens/s, about reading speed
    "chat": SLO(ttft_ms=2000, tpot_ms=200),
    # 64-token prompts streamed to a reader like chat; the long outputs make TPOT the one that counts
    "reasoning": SLO(ttft_ms=2000, tpot_ms=200),
    # batch-like traffic with prompts up to 768 tokens, whose prefill takes seconds on 2 CPU cores:
    # lenient (the values of the recorded runs in docs/SERVE_BENCH.md)
    "random": SLO(ttft_ms=5000, tpot_ms=500),
    # a 4096-token prefill alone takes seconds on CPU: 10 s lets a long prompt pass when it runs
    # alone, so TTFT misses mean queueing behind other long prefills; TPOT catches the decodes
    # that stall while a long prefill runs
    "long-short-mix": SLO(ttft_ms=10000, tpot_ms=500),
    # a prefix-cache hit leaves only the 128-token suffix to prefill (well under 1 s): 3 s leaves
    # room for queueing, while a group's uncached first request (1152 tokens) may miss
    "shared-prefix": SLO(ttft_ms=3000, tpot_ms=500),
    # someone else's traffic, targets unknown: the lenient generic values
    TRACE: SLO(ttft_ms=5000, tpot_ms=500),
}

# SLO field, its flag, its name in reports
FIELDS = (("ttft_ms", "--slo-ttft-ms", "TTFT"), ("tpot_ms", "--slo-tpot-ms", "TPOT"),
          ("e2e_ms", "--slo-e2e-ms", "E2E"))


@dataclass(frozen=True)
class SLOChoice:
    slo: SLO
    sources: dict[str, str]  # each SLO in force -> "flag" or "default"
    workload: str  # the key of DEFAULT_SLOS the defaults came from

    def describe(self) -> str:
        return describe_slo(self.slo.values(), self.sources, self.workload)

    def annotate(self, summary: dict[str, Any]) -> None:
        """Record in a run's summary where its SLOs came from, or why there is no goodput."""
        if summary.get("goodput"):
            summary["goodput"]["slo_source"] = dict(self.sources)
            summary["goodput"]["slo_workload"] = self.workload
        else:
            summary["goodput_note"] = ("goodput not computed: every SLO is off "
                                       "(give --slo-ttft-ms, --slo-tpot-ms or --slo-e2e-ms in ms)")


def defaults_key(workload: str) -> str:
    return workload if workload in WORKLOADS else TRACE


def parse_slo_flag(flag: str, raw: str | None) -> float | str | None:
    """A flag's value: milliseconds, OFF, or None (not given)."""
    if raw is None:
        return None
    if raw.strip().lower() == OFF:
        return OFF
    try:
        value = float(raw)
    except ValueError:
        raise BenchError(f"{flag} must be milliseconds or '{OFF}', got {raw!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise BenchError(f"{flag} must be > 0 and finite (or '{OFF}'), got {value:g}")
    return value


def choose_slo(workload: str, flags: dict[str, str | None]) -> SLOChoice:
    """Each SLO from its flag (`flags` maps "ttft_ms" etc. to the raw flag value), else the default."""
    key = defaults_key(workload)
    default = DEFAULT_SLOS[key]
    values: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for name, flag, _ in FIELDS:
        given = parse_slo_flag(flag, flags.get(name))
        value = getattr(default, name) if given is None else given
        values[name] = None if value == OFF else value
        if values[name] is not None:
            sources[name] = "default" if given is None else "flag"
    return SLOChoice(SLO(**values), sources, key)


def describe_slo(values: dict[str, float], sources: dict[str, str] | None, workload: str | None) -> str:
    """E.g. "TTFT <= 2000 ms (default for chat), TPOT <= 100 ms (--slo-tpot-ms), no E2E SLO"."""
    parts, missing = [], []
    for name, flag, label in FIELDS:
        if name not in values:
            missing.append(label)
            continue
        source = (sources or {}).get(name)
        where = {"default": f" (default for {workload})", "flag": f" ({flag})"}.get(source or "", "")
        parts.append(f"{label} <= {values[name]:g} ms{where}")
    if not parts:
        return "none"
    return ", ".join(parts) + (f", no {'/'.join(missing)} SLO" if missing else "")
