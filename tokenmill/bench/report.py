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
from tokenmill.bench.plots import plot_latency_cdfs, plot_sweep

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
STATS = ("mean", "p50", "p90", "p95", "p99")


def headline_rows(s: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = [
        ["Requests completed / failed / sent", f"{s['completed']} / {s['failed']} / {s['sent']}"],
        ["Benchmark duration (s)", s["duration_s"]],
        ["Total input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}"],
        ["Request throughput (req/s)", s["request_throughput"]],
        ["Output token throughput (tok/s)", s["output_throughput"]],
        ["Total token throughput (tok/s)", s["total_token_throughput"]],
    ]
    if s.get("interrupted") or s.get("not_sent"):
        rows.append(["Interrupted / not sent", f"{s['interrupted']} / {s['not_sent']}"])
    if s.get("usage_missing"):
        rows.append(["Requests without server usage (chunk-counted)", s["usage_missing"]])
    if g := s.get("goodput"):
        slo = ", ".join(f"{k}<={v:g}" for k, v in g["slo"].items())
        rows.append([f"Goodput (req/s, {slo})", g["requests_per_s"]])
        rows.append(["SLO attainment (%)", g["attainment_pct"]])
    if c := s.get("cost"):
        rows.append([f"Cost per 1M output tokens (at {c['price_per_hour']:g}/h)", c["per_million_output_tokens"]])
        rows.append(["Cost per request", _small(c["per_request"])])
    if srv := s.get("server"):
        if "mean_queue_time_ms" in srv:
            rows.append(["Server mean queue time (ms)", srv["mean_queue_time_ms"]])
        if "prefix_cache_hit_rate" in srv:
            rows.append(["Server prefix-cache hit rate (%)", 100.0 * srv["prefix_cache_hit_rate"]])
        if "preemptions" in srv:
            rows.append(["Server preemptions", int(srv["preemptions"])])
    return rows


def _small(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def summary_markdown(s: dict[str, Any]) -> str:
    latency = [[name] + [s[key][k] for k in STATS] for key, name in LATENCIES]
    parts = [
        md_table(["Metric", "Value"], headline_rows(s)),
        "### Latency (ms)",
        md_table(["Metric"] + list(STATS), latency),
    ]
    if s.get("errors"):
        parts += ["### Errors", md_table(["Error", "Count"], [[e, n] for e, n in s["errors"].items()])]
    return "\n\n".join(parts)


def _shown(v: Any) -> bool:
    return v is not None and v is not False and v != {} and v != ""


def meta_markdown(meta: dict[str, Any]) -> str:
    keys = ("date", "host", "base_url", "model", "endpoint", "workload", "workload_opts", "num_requests",
            "prompts", "arrivals", "seed", "slo", "price_per_hour", "interrupted")
    lines = [f"- Command: `{meta.get('command', '')}`"]
    lines += [f"- {k}: {meta[k]}" for k in keys if _shown(meta.get(k))]
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


def write_run(out: Path, results: Sequence[RequestResult], summary: dict[str, Any], meta: dict[str, Any]) -> None:
    """results.json, report.md and latency_cdf.png for one run."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"meta": meta, "summary": summary,
                                      "requests": [result_record(r) for r in results]})
    title = "# tokenmill bench serve" + (" (interrupted)" if meta.get("interrupted") else "")
    text = "\n\n".join([title, meta_markdown(meta), summary_markdown(summary)])
    (out / "report.md").write_text(text + "\n", encoding="utf-8")
    plot_latency_cdfs(out / "latency_cdf.png", {"": results})


def sweep_markdown(rows: Sequence[tuple[float, dict[str, Any]]]) -> str:
    header = ["Rate (req/s)", "Completed", "Failed", "Req/s", "Output tok/s", "Goodput (req/s)",
              "SLO attained (%)", "Cost / 1M output tokens", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
              "E2E p99"]
    body = []
    for rate, s in rows:
        g = s.get("goodput") or {}
        c = s.get("cost") or {}
        body.append([rate_label(rate), s["completed"], s["failed"], s["request_throughput"],
                     s["output_throughput"], g.get("requests_per_s"), g.get("attainment_pct"),
                     c.get("per_million_output_tokens"), s["ttft_ms"]["p50"], s["ttft_ms"]["p99"],
                     s["tpot_ms"]["p50"], s["tpot_ms"]["p99"], s["e2e_ms"]["p99"]])
    return md_table(header, body) + "\n\n(latencies in ms; cost at the price per hour given)"


def write_sweep(
    out: Path,
    rows: Sequence[tuple[float, dict[str, Any]]],
    results: dict[str, Sequence[RequestResult]],
    meta: dict[str, Any],
) -> None:
    """sweep.json, report.md and sweep plots over all rates run so far."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "sweep.json", {"meta": meta, "runs": [{"request_rate": r, "summary": s} for r, s in rows]})
    title = "# tokenmill bench serve: sweep" + (" (interrupted)" if meta.get("interrupted") else "")
    sections = [title, meta_markdown(meta), sweep_markdown(rows)]
    for rate, s in rows:
        sections += [f"## Request rate {rate_label(rate)} req/s", summary_markdown(s)]
    (out / "report.md").write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    plot_latency_cdfs(out / "latency_cdf.png", results)
    plot_sweep(out, rows)
