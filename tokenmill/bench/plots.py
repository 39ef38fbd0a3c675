"""Benchmark plots (matplotlib, Agg backend): latency CDFs, and throughput and latency against rate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenmill.bench.client import RequestResult
from tokenmill.bench.fmt import rate_label
from tokenmill.bench.metrics import request_tpot


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdfs(path: Path, runs: dict[str, Sequence[RequestResult]]) -> None:
    """Empirical CDFs of TTFT, TPOT and E2E latency (ms), one line per labelled run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, results in runs.items():
        ok = [r for r in results if r.success]
        series = {
            "TTFT": [r.ttft_s for r in ok if r.ttft_s is not None],
            "TPOT": [t for t in map(request_tpot, ok) if t is not None],
            "E2E latency": [r.e2e_s for r in ok if r.e2e_s is not None],
        }
        for ax, (name, values) in zip(axes, series.items()):
            xs = sorted(v * 1000.0 for v in values)
            if xs:
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=label or None)
    for ax, name in zip(axes, ("TTFT", "TPOT", "E2E latency")):
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(title="req/s", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _rate_axis(ax: Any, rates: Sequence[float]) -> list[float]:
    if all(math.isfinite(r) for r in rates):
        ax.set_xlabel("request rate (req/s)")
        return list(rates)
    ax.set_xticks(range(len(rates)), [rate_label(r) for r in rates])
    ax.set_xlabel("request rate (req/s)")
    return list(range(len(rates)))


def plot_sweep(out: Path, rows: Sequence[tuple[float, dict[str, Any]]]) -> None:
    """sweep_throughput.png and sweep_p99_latency.png against request rate."""
    plt = _pyplot()
    rates = [r for r, _ in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = _rate_axis(a1, rates)
    _rate_axis(a2, rates)
    a1.plot(xs, [s["output_throughput"] for _, s in rows], "o-")
    a1.set_ylabel("output tokens/s")
    a2.plot(xs, [s["request_throughput"] for _, s in rows], "o-", label="throughput")
    if all(s.get("goodput") for _, s in rows):
        a2.plot(xs, [s["goodput"]["requests_per_s"] for _, s in rows], "s--", label="goodput")
    a2.set_ylabel("requests/s")
    a2.legend()
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sweep_throughput.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, name) in zip(axes, (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))):
        xs = _rate_axis(ax, rates)
        ys = [s[key]["p99"] if s[key]["p99"] is not None else float("nan") for _, s in rows]
        ax.plot(xs, ys, "o-")
        ax.set_ylabel(f"p99 {name} (ms)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sweep_p99_latency.png", dpi=100)
    plt.close(fig)
