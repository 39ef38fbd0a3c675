"""Benchmark outputs: results.json, report.md (and the plots, see `plots`)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenmill.bench.client import RequestResult
from tokenmill.bench.fmt import md_table, rate_label
from tokenmill.bench.metrics import request_tpot
from tokenmill.bench.plots import latency_cdf_figure, plot_sweep, plot_title, save
from tokenmill.bench.price import NO_COST, describe_price
from tokenmill.bench.slos import describe_slo

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
STATS = ("mean", "p50", "p90", "p95", "p99")


def headline_rows(s: dict[str, Any]) -> list[list[Any]]:
    """Goodput and cost, with what they were measured against; never a silent blank."""
    rows: list[list[Any]] = []
    if g := s.get("goodput"):
        rows += [["Goodput (req/s)", g["requests_per_s"]],
                 ["SLO attainment (%)", g["attainment_pct"]],
                 ["SLOs", _slos(g)]]
    else:
        rows.append(["Goodput (req/s)", s.get("goodput_note") or "not computed: no SLO given"])
    if c := s.get("cost"):
        rows += [["Cost per 1M output tokens ($)", c["per_million_output_tokens"]],
                 ["Cost per 1M total tokens ($)", c.get("per_million_total_tokens")],
                 ["Cost per request ($)", _small(c["per_request"])],
                 ["Price", describe_price(c)]]
    else:
        rows.append(["Cost per 1M output tokens ($)", s.get("cost_note") or NO_COST])
    return rows


def _slos(goodput: dict[str, Any]) -> str:
    return describe_slo(goodput["slo"], goodput.get("slo_source"), goodput.get("slo_workload"))


def headline_notes(s: dict[str, Any]) -> list[str]:
    """What goodput and cost were measured against, or why they were not computed."""
    g, c = s.get("goodput"), s.get("cost")
    slo = f"SLOs: {_slos(g)}" if g else s.get("goodput_note") or "goodput not computed: no SLO given"
    price = f"Price: {describe_price(c)}" if c else s.get("cost_note") or NO_COST
    return [slo, price]


def run_rows(s: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = [
        ["Requests completed / failed / sent (req)", f"{s['completed']} / {s['failed']} / {s['sent']}"],
        ["Benchmark duration (s)", s["duration_s"]],
        ["Total input / output tokens (tok)", f"{s['total_input_tokens']} / {s['total_output_tokens']}"],
        ["Request throughput (req/s)", s["request_throughput"]],
        ["Output token throughput (tok/s)", s["output_throughput"]],
        ["Total token throughput (tok/s)", s["total_token_throughput"]],
    ]
    if s.get("interrupted") or s.get("not_sent"):
        rows.append(["Requests interrupted / not sent (req)", f"{s['interrupted']} / {s['not_sent']}"])
    if s.get("usage_missing"):
        rows.append(["Requests without server usage, chunk-counted (req)", s["usage_missing"]])
    return rows + server_rows(s.get("server") or {})


def server_rows(srv: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    if "mean_queue_time_ms" in srv:
        rows.append(["Server mean queue time (ms)", srv["mean_queue_time_ms"]])
    if "prefix_cache_hit_rate" in srv:
        rows.append(["Server prefix-cache hit rate (%)", 100.0 * srv["prefix_cache_hit_rate"]])
    if "preemptions" in srv:
        rows.append(["Server preemptions (requests)", int(srv["preemptions"])])
    return rows


def _small(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def summary_markdown(s: dict[str, Any]) -> str:
    latency = [[name] + [s[key][k] for k in STATS] for key, name in LATENCIES]
    parts = [
        md_table(["Metric", "Value"], headline_rows(s) + run_rows(s)),
        "### Latency",
        md_table(["Metric"] + [f"{k} (ms)" for k in STATS], latency),
    ]
    if s.get("errors"):
        parts += ["### Errors", md_table(["Error", "Requests"], [[e, n] for e, n in s["errors"].items()])]
    return "\n\n".join(parts)


def _shown(v: Any) -> bool:
    return v is not None and v is not False and v != {} and v != ""


def meta_markdown(meta: dict[str, Any]) -> str:
    keys = ("date", "host", "base_url", "simulated", "model", "endpoint", "workload", "workload_opts", "num_requests",
            "prompts", "arrivals", "seed", "interrupted")
    lines = [f"- Command: `{meta.get('command', '')}`"]
    for k in keys:
        if _shown(meta.get(k)):
            default = k == "endpoint" and meta.get("endpoint_source") == "default"
            lines.append(f"- {k}: {meta[k]}" + (f" (default for --workload {meta['workload']})" if default else ""))
    if "slo" in meta:
        lines.append(f"- SLOs: {describe_slo(meta['slo'], meta.get('slo_source'), meta.get('slo_defaults_for'))}")
    if meta.get("price_per_hour") is not None:
        lines.append(f"- Price: {describe_price(meta)}")
    elif meta.get("cost_note"):
        lines.append(f"- Price: none, {meta['cost_note']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- files


def result_record(r: RequestResult) -> dict[str, Any]:
    rec = dataclasses.asdict(r)
    rec["tpot_s"] = request_tpot(r)
    return rec


def _json_safe(obj: Any) -> Any:
    """inf/nan are not JSON: write them as strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(_json_safe(obj), indent=2) + "\n", encoding="utf-8")


def write_run(out: Path, results: Sequence[RequestResult], summary: dict[str, Any], meta: dict[str, Any],
              title: str = "tokenmill bench serve") -> None:
    """results.json, report.md and latency_cdf.png for one run."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"meta": meta, "summary": summary,
                                      "requests": [result_record(r) for r in results]})
    title = f"# {title}" + (" (interrupted)" if meta.get("interrupted") else "")
    text = "\n\n".join([title, meta_markdown(meta), summary_markdown(summary)])
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    save(latency_cdf_figure({"": results}, plot_title(meta, meta.get("arrivals") or ""), meta.get("slo") or {}),
         out / "latency_cdf.png")


def sweep_markdown(rows: Sequence[tuple[float | None, dict[str, Any]]], notes: bool = True) -> str:
    """The sweep table; with `notes`, the SLOs and price under it (the console has no meta)."""
    header = ["Rate (req/s)", "Completed (req)", "Failed (req)", "Throughput (req/s)", "Output (tok/s)",
              "Goodput (req/s)", "SLO attained (%)", "Cost ($/1M output tok)", "Cost ($/1M total tok)",
              "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)", "E2E p99 (ms)"]
    body = []
    for rate, s in rows:
        g = s.get("goodput") or {}
        c = s.get("cost") or {}
        body.append([rate_label(rate), s["completed"], s["failed"], s["request_throughput"],
                     s["output_throughput"], g.get("requests_per_s"), g.get("attainment_pct"),
                     c.get("per_million_output_tokens"), c.get("per_million_total_tokens"),
                     s["ttft_ms"]["p50"], s["ttft_ms"]["p99"], s["tpot_ms"]["p50"], s["tpot_ms"]["p99"],
                     s["e2e_ms"]["p99"]])
    lines = "\n".join(f"- {note}" for note in headline_notes(rows[0][1])) if rows and notes else ""
    return md_table(header, body) + ("\n\n" + lines if lines else "")


def write_sweep(
    out: Path,
    rows: Sequence[tuple[float | None, dict[str, Any]]],
    results: dict[str, Sequence[RequestResult]],
    meta: dict[str, Any],
    title: str = "tokenmill bench serve",
) -> None:
    """sweep.json, report.md and sweep plots over all rates run so far."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "sweep.json", {"meta": meta, "runs": [{"request_rate": r, "summary": s} for r, s in rows]})
    title = f"# {title}: sweep" + (" (interrupted)" if meta.get("interrupted") else "")
    plots = plot_sweep(out, rows, results, meta)
    sections = [title, meta_markdown(meta), sweep_markdown(rows, notes=False), plots_markdown(plots)]
    for rate, s in rows:
        sections += [f"## Request rate {rate_label(rate)} req/s", summary_markdown(s)]
    (out / "report.md").write_text("\n\n".join(sections) + "\n", encoding="utf-8")


def plots_markdown(plots: dict[str, str | None]) -> str:
    """The plots written, and why any was skipped."""
    return "Plots: " + ", ".join(f"`{name}`" + (f" skipped: {why}" if why else "") for name, why in plots.items())
