"""`bench compare`: two runs' summaries side by side, with ratios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenmill.bench.fmt import md_table, rate_label
from tokenmill.bench.report import LATENCIES
from tokenmill.bench.workloads import BenchError

# summary key -> unit
COMPARE_KEYS: dict[str, str] = {
    "completed": "req", "failed": "req", "duration_s": "s", "request_throughput": "req/s",
    "output_throughput": "tok/s", "total_token_throughput": "tok/s", "goodput.requests_per_s": "req/s",
    "goodput.attainment_pct": "%", "cost.per_million_output_tokens": "$/1M output tok",
    "cost.per_million_total_tokens": "$/1M total tok", "cost.per_request": "$",
    **{f"{k}.{s}": "ms" for k, _ in LATENCIES for s in ("mean", "p50", "p90", "p99")},
    "server.mean_queue_time_ms": "ms", "server.prefix_cache_hit_rate": "fraction",
    "server.preemptions": "req",
}


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
    for key, unit in COMPARE_KEYS.items():
        va, vb = lookup(a, key), lookup(b, key)
        if va is None and vb is None:
            continue
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        rows.append([key, unit, va, vb, None if ratio is None else f"{ratio:.3f}"])
    return md_table(["Metric", "Unit", "A", "B", "B/A"], rows)


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
