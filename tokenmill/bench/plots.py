"""Benchmark plots (matplotlib, Agg backend): latency CDFs for a run; throughput, p99 latency and
cost against request rate for a sweep. Every figure is titled with the model, workload and rate,
its value axes start at 0, and the SLOs in force are drawn as dashed lines on the latency axes.

The `*_figure` functions build a figure (for tests to inspect); `save` writes and closes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenmill.bench.client import RequestResult
from tokenmill.bench.fmt import rate_label
from tokenmill.bench.metrics import request_tpot

Rows = Sequence[tuple[float | None, dict[str, Any]]]

# summary key, axis name, SLO field
LATENCY_PANELS = (("ttft_ms", "TTFT", "ttft_ms"), ("tpot_ms", "TPOT", "tpot_ms"), ("e2e_ms", "E2E latency", "e2e_ms"))
SLO_STYLE = {"color": "tab:red", "linestyle": "--", "linewidth": 1}
# an SLO line further out than this many times the largest value would squash the data into the
# axis's first few pixels: it is named in a corner instead
SLO_OFF_SCALE = 2.0


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_title(meta: dict[str, Any], rate_text: str) -> str:
    """E.g. "tiny | chat | Poisson, 4 req/s"; a trace is named by its file name."""
    workload = Path(str(meta.get("workload") or "?")).name
    return " | ".join(p for p in (str(meta.get("model") or "?"), workload, rate_text) if p)


def sweep_rate_text(rates: Sequence[float | None]) -> str:
    return f"sweep over {', '.join(rate_label(r) for r in rates)} req/s"


def save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def _slo_line(ax: Any, value: float | None, vertical: bool, data: Sequence[float]) -> None:
    """The SLO as a dashed line across the latency axis, or named in a corner when it lies far
    beyond every value (`data`)."""
    if value is None:
        return
    finite = [v for v in data if math.isfinite(v)]
    if finite and value > SLO_OFF_SCALE * max(finite):
        where = "right" if vertical else "above"
        ax.text(0.98, 0.03, f"SLO {value:g} ms: off scale ({where})", transform=ax.transAxes,
                ha="right", va="bottom", color=SLO_STYLE["color"], fontsize=8)
        return
    line = ax.axvline if vertical else ax.axhline
    line(value, label=f"SLO {value:g} ms", **SLO_STYLE)


def _cdf_series(results: Sequence[RequestResult]) -> list[list[float]]:
    """TTFT, TPOT and E2E of the successful requests, ms, in LATENCY_PANELS order."""
    ok = [r for r in results if r.success]
    series = ([r.ttft_s for r in ok if r.ttft_s is not None],
              [t for t in map(request_tpot, ok) if t is not None],
              [r.e2e_s for r in ok if r.e2e_s is not None])
    return [sorted(v * 1000.0 for v in values) for values in series]


def latency_cdf_figure(runs: dict[str, Sequence[RequestResult]], title: str, slo: dict[str, float]) -> Any:
    """Empirical CDFs of TTFT, TPOT and E2E latency (ms), one line per labelled run."""
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 4.4))
    seen: list[list[float]] = [[], [], []]
    for label, results in runs.items():
        for ax, xs, panel in zip(axes, _cdf_series(results), seen):
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label or None)
                panel += xs
    for ax, (_, name, slo_key), data in zip(axes, LATENCY_PANELS, seen):
        _slo_line(ax, slo.get(slo_key), vertical=True, data=data)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_xlim(left=0)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(title="req/s" if len(runs) > 1 else None, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _rate_axis(ax: Any, rates: Sequence[float | None]) -> list[float]:
    """x positions of the rates: the rates themselves, or evenly spaced labels when one is inf."""
    ax.set_xlabel("offered request rate (req/s)")
    if all(r is not None and math.isfinite(r) for r in rates):
        return [float(r) for r in rates]  # type: ignore[arg-type]
    ax.set_xticks(range(len(rates)), [rate_label(r) for r in rates])
    return list(range(len(rates)))


def _finish(ax: Any) -> None:
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def _value(v: Any) -> float:
    return float("nan") if v is None else float(v)


def sweep_throughput_figure(rows: Rows, title: str) -> Any:
    fig, (a1, a2) = _pyplot().subplots(1, 2, figsize=(11, 4.4))
    rates = [r for r, _ in rows]
    xs = _rate_axis(a1, rates)
    _rate_axis(a2, rates)
    a1.plot(xs, [s["output_throughput"] for _, s in rows], "o-")
    a1.set_ylabel("output token throughput (tok/s)")
    a2.plot(xs, [s["request_throughput"] for _, s in rows], "o-", label="throughput")
    if all(s.get("goodput") for _, s in rows):
        a2.plot(xs, [s["goodput"]["requests_per_s"] for _, s in rows], "s--", label="goodput (within SLOs)")
    a2.set_ylabel("completed requests (req/s)")
    a2.legend()
    for ax in (a1, a2):
        _finish(ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def sweep_latency_figure(rows: Rows, title: str, slo: dict[str, float]) -> Any:
    fig, axes = _pyplot().subplots(1, 3, figsize=(15, 4.4))
    rates = [r for r, _ in rows]
    for ax, (key, name, slo_key) in zip(axes, LATENCY_PANELS):
        xs = _rate_axis(ax, rates)
        p99 = [_value(s[key]["p99"]) for _, s in rows]
        ax.plot(xs, p99, "o-", label="p99")
        ax.plot(xs, [_value(s[key]["p50"]) for _, s in rows], "o:", label="p50")
        _slo_line(ax, slo.get(slo_key), vertical=False, data=p99)
        ax.set_ylabel(f"{name} (ms)")
        ax.legend(fontsize=8)
        _finish(ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def sweep_cost_figure(rows: Rows, title: str) -> Any | None:
    """$ per 1M output (and total) tokens against offered rate; None when no rate has a cost."""
    costs = [s.get("cost") or {} for _, s in rows]
    if not any(c.get("per_million_output_tokens") is not None for c in costs):
        return None
    fig, ax = _pyplot().subplots(figsize=(7, 4.4))
    xs = _rate_axis(ax, [r for r, _ in rows])
    ax.plot(xs, [_value(c.get("per_million_output_tokens")) for c in costs], "o-", label="per 1M output tokens")
    if any(c.get("per_million_total_tokens") is not None for c in costs):
        ax.plot(xs, [_value(c.get("per_million_total_tokens")) for c in costs], "s--",
                label="per 1M total (prompt + output) tokens")
    ax.set_ylabel("cost ($ per 1M tokens)")
    ax.legend(fontsize=8)
    _finish(ax)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_sweep(out: Path, rows: Rows, results: dict[str, Sequence[RequestResult]],
               meta: dict[str, Any]) -> dict[str, str | None]:
    """The sweep's plots in `out`: {file name: None if written, else why it was skipped}."""
    title = plot_title(meta, sweep_rate_text([r for r, _ in rows]))
    slo = meta.get("slo") or {}
    written: dict[str, str | None] = {}
    figures = {
        "latency_cdf.png": latency_cdf_figure(results, title, slo),
        "sweep_throughput.png": sweep_throughput_figure(rows, title),
        "sweep_p99_latency.png": sweep_latency_figure(rows, title, slo),
        "sweep_cost.png": sweep_cost_figure(rows, title),
    }
    for name, fig in figures.items():
        if fig is None:
            written[name] = "cost not computed (pass --price-per-hour)"
            (out / name).unlink(missing_ok=True)  # from an earlier, interrupted write of this sweep
            continue
        save(fig, out / name)
        written[name] = None
    return written
