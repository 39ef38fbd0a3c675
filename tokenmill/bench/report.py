"""Benchmark outputs: results.json, report.md, PNG plots, and side-by-side comparison."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenmill.bench.client import RequestResult
from tokenmill.bench.metrics import request_tpot
from tokenmill.bench.workloads import BenchError

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
STATS = ("mean", "p50", "p90", "p95", "p99")


# ---------------------------------------------------------------- formatting


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:,.{digits}f}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)


def rate_label(rate: float | None) -> str:
    return "trace" if rate is None else fmt(float(rate), 2).rstrip("0").rstrip(".")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


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


# ---------------------------------------------------------------- plots


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


# ---------------------------------------------------------------- compare

COMPARE_KEYS = (
    "completed", "failed", "duration_s", "request_throughput", "output_throughput",
    "total_token_throughput", "goodput.requests_per_s", "goodput.attainment_pct",
    "cost.per_million_output_tokens", "cost.per_request",
    *(f"{k}.{s}" for k, _ in LATENCIES for s in ("mean", "p50", "p90", "p99")),
    "server.mean_queue_time_ms", "server.prefix_cache_hit_rate", "server.preemptions",
)


def lookup(summary: dict[str, Any], dotted: str) -> Any:
    v: Any = summary
    for part in dotted.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v


def load_summaries(path: str) -> dict[str, dict[str, Any]]:
    """{label: summary} from a run's results.json, a sweep's sweep.json, or their folder."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json" if (p / "results.json").is_file() else p / "sweep.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchError(f"cannot read benchmark results from {path}: {e}") from None
    if isinstance(data, dict) and isinstance(data.get("summary"), dict):
        rate = _float((data.get("meta") or {}).get("request_rate"))
        return {f"rate {rate_label(rate)}": data["summary"]}
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return {f"rate {rate_label(_float(r['request_rate']))}": r["summary"] for r in data["runs"]}
    raise BenchError(f"{p} is not a tokenmill bench results.json or sweep.json")


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def compare_table(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = []
    for key in COMPARE_KEYS:
        va, vb = lookup(a, key), lookup(b, key)
        if va is None and vb is None:
            continue
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        rows.append([key, va, vb, None if ratio is None else f"{ratio:.3f}"])
    return md_table(["Metric", "A", "B", "B/A"], rows)


def compare_runs(path_a: str, path_b: str) -> str:
    a, b = load_summaries(path_a), load_summaries(path_b)
    pairs = [(k, a[k], b[k]) for k in a if k in b]
    if not pairs and len(a) == 1 and len(b) == 1:
        pairs = [("", next(iter(a.values())), next(iter(b.values())))]
    if not pairs:
        raise BenchError(f"{path_a} and {path_b} have no request rates in common")
    parts = [f"A = {path_a}\nB = {path_b}"]
    for label, sa, sb in pairs:
        parts.append((f"## {label}\n\n" if len(pairs) > 1 else "") + compare_table(sa, sb))
    return "\n\n".join(parts)
