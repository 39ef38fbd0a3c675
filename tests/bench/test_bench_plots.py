"""Plots: titled with model, workload and rate; value axes from 0; SLO lines; the cost plot.

Checks the matplotlib objects, never pixels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokenmill.bench.client import RequestResult
from tokenmill.bench.metrics import SLO, summarize
from tokenmill.bench.plots import (
    latency_cdf_figure,
    plot_sweep,
    plot_title,
    sweep_cost_figure,
    sweep_latency_figure,
    sweep_throughput_figure,
)

META = {"model": "tiny", "workload": "chat", "slo": {"ttft_ms": 150.0, "tpot_ms": 5000.0}}


@pytest.fixture(autouse=True)
def _close_figures() -> Any:
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def results(ttft_s: float, n: int = 5) -> list[RequestResult]:
    return [RequestResult(i, 10, 5, 0.0, start_s=0.0, success=True, ttft_s=ttft_s * (1 + i / 10),
                          e2e_s=ttft_s * (1 + i / 10) + 0.04, prompt_tokens=10, output_tokens=5,
                          usage_reported=True) for i in range(n)]


def rows(price: float | None) -> list[tuple[float, dict[str, Any]]]:
    """The same 5 requests at three rates: (rate, TTFT in s, run duration in s)."""
    runs = ((1.0, 0.05, 4.0), (2.0, 0.1, 2.0), (float("inf"), 0.2, 1.0))
    return [(rate, summarize(results(ttft), duration, 5, SLO(ttft_ms=150), price)) for rate, ttft, duration in runs]


def slo_lines(ax: Any) -> list[str]:
    return [line.get_label() for line in ax.get_lines() if line.get_label().startswith("SLO")]


def off_scale_notes(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.texts if "off scale" in t.get_text()]


def test_title_names_model_workload_and_rate() -> None:
    assert plot_title(META, "Poisson, 4 req/s") == "tiny | chat | Poisson, 4 req/s"
    assert plot_title({"model": "m", "workload": "/data/traces/day1.jsonl"}, "trace timestamps") == \
        "m | day1.jsonl | trace timestamps"


def test_latency_cdfs_titled_from_zero_with_slo_lines() -> None:
    fig = latency_cdf_figure({"": results(0.1)}, "tiny | chat | Poisson, 4 req/s", META["slo"])
    assert fig.get_suptitle() == "tiny | chat | Poisson, 4 req/s"
    ttft, tpot, e2e = fig.axes
    for ax in fig.axes:
        assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0
        assert "(ms)" in ax.get_xlabel()
    assert slo_lines(ttft) == ["SLO 150 ms"]  # within reach of the data: drawn
    assert slo_lines(tpot) == [] and off_scale_notes(tpot) == ["SLO 5000 ms: off scale (right)"]
    assert slo_lines(e2e) == [] and off_scale_notes(e2e) == []  # no E2E SLO


def test_sweep_figures_titled_from_zero() -> None:
    title = "tiny | chat | sweep over 1, 2, inf req/s"
    figs = [sweep_throughput_figure(rows(1.0), title), sweep_latency_figure(rows(1.0), title, META["slo"]),
            sweep_cost_figure(rows(1.0), title)]
    for fig in figs:
        assert fig.get_suptitle() == title
        for ax in fig.axes:
            assert ax.get_ylim()[0] == 0
            assert "(" in ax.get_ylabel() and ax.get_xlabel() == "offered request rate (req/s)"
    assert slo_lines(figs[1].axes[0]) == ["SLO 150 ms"]


def test_cost_plot_against_rate() -> None:
    fig = sweep_cost_figure(rows(2.0), "t")
    (ax,) = fig.axes
    assert ax.get_ylabel() == "cost ($ per 1M tokens)"
    per_output = ax.get_lines()[0].get_ydata()
    assert per_output[0] == pytest.approx(2 * per_output[1])  # the same tokens in half the time
    assert sweep_cost_figure(rows(None), "t") is None  # no price: no plot


def test_plot_sweep_writes_files_and_skips_cost_cleanly(tmp_path: Path) -> None:
    by_rate = {"1": results(0.05), "2": results(0.1)}
    written = plot_sweep(tmp_path, rows(1.0), by_rate, META)
    assert written == dict.fromkeys(["latency_cdf.png", "sweep_throughput.png", "sweep_p99_latency.png",
                                     "sweep_cost.png"])
    assert all((tmp_path / name).stat().st_size > 0 for name in written)
    written = plot_sweep(tmp_path, rows(None), by_rate, META)
    assert "cost not computed" in written["sweep_cost.png"]
    assert not (tmp_path / "sweep_cost.png").exists()
