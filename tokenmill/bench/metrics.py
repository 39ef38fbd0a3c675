"""Serving-benchmark metrics (pure functions), with `vllm bench serve` conventions.

Per request (successful requests only):

- **TTFT** (time to first token): from sending the request to the first streamed chunk carrying
  generated text.
- **TPOT** (time per output token, excluding the first): ``(e2e - ttft) / (output_tokens - 1)``;
  undefined (left out) for requests with a single output token.
- **ITL** (inter-token latency): every gap between successive text chunks, pooled over requests
  (a chunk may hold several tokens, so ITL can exceed TPOT).
- **E2E** latency: from sending the request to the end of its stream.

Each is reported in milliseconds as mean, p50, p90, p95 and p99 (linear interpolation between
order statistics, as ``numpy.percentile``).

Over the run (``duration`` = first send to last completion, wall clock):

- request throughput = completed requests / duration;
- output token throughput = output tokens of completed requests / duration;
- total token throughput = (prompt + output tokens of completed requests) / duration;
- **goodput** = completed requests meeting every given SLO (TTFT <= ``ttft_ms``, TPOT <=
  ``tpot_ms``, E2E <= ``e2e_ms``; a request without a TPOT passes the TPOT SLO) / duration, and
  **SLO attainment** = those requests / all requests sent, in percent (failures count as misses,
  requests cut off by Ctrl-C are left out);
- **cost** = duration in hours x price per hour; per million output tokens = cost / output tokens
  x 1e6; per million total tokens = cost / (prompt + output tokens) x 1e6; per request = cost /
  completed requests.

Token counts are the server's ``usage`` numbers (prompt tokens fall back to the workload's
expected length when the server gives none).

From the server's Prometheus ``/metrics`` (scraped before and after, differences used), when it
exports them under the ``tokenmill:`` prefix (or, for vLLM, the same names under ``vllm:``):
mean queue time = d(``request_queue_time_seconds_sum``) / d(``..._count``); prefix-cache hit
rate = d(``prefix_cache_hits_total``) / d(``prefix_cache_queries_total``) (in tokens);
preemptions = d(``num_preemptions_total``); server-side generated tokens =
d(``generation_tokens_total``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenmill.bench.client import INTERRUPTED, RequestResult

PERCENTILES = (50, 90, 95, 99)

# Prometheus sample names, without the server's prefix (ours first; vLLM exports the same names)
SERVER_PREFIXES = ("tokenmill:", "vllm:")
QUEUE_SUM = "request_queue_time_seconds_sum"
QUEUE_COUNT = "request_queue_time_seconds_count"
PREFIX_QUERIES = "prefix_cache_queries_total"
PREFIX_HITS = "prefix_cache_hits_total"
PREEMPTIONS = "num_preemptions_total"
GENERATION_TOKENS = "generation_tokens_total"
SERVER_SAMPLES = (QUEUE_SUM, QUEUE_COUNT, PREFIX_QUERIES, PREFIX_HITS, PREEMPTIONS, GENERATION_TOKENS)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def values(self) -> dict[str, float]:
        """The SLOs in force, by field name."""
        return {k: v for k, v in vars(self).items() if v is not None}

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_stats(values_s: Sequence[float]) -> dict[str, float | None]:
    """mean and percentiles, in milliseconds, of latencies given in seconds."""
    ms = [v * 1000.0 for v in values_s]
    out: dict[str, float | None] = {"mean": float(np.mean(ms)) if ms else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(ms, q)
    return out


def request_tpot(r: RequestResult) -> float | None:
    """Seconds per output token after the first; None if undefined."""
    if not r.success or r.output_tokens < 2 or r.ttft_s is None or r.e2e_s is None:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def meets_slo(r: RequestResult, slo: SLO) -> bool:
    if not r.success:
        return False
    tpot = request_tpot(r)
    checks = [
        (slo.ttft_ms, r.ttft_s),
        (slo.tpot_ms, tpot),
        (slo.e2e_ms, r.e2e_s),
    ]
    return all(limit is None or v is None or v * 1000.0 <= limit for limit, v in checks)


def goodput(results: Sequence[RequestResult], slo: SLO, duration_s: float) -> dict[str, Any] | None:
    if not slo.active:
        return None
    counted = [r for r in results if r.error != INTERRUPTED]
    good = sum(meets_slo(r, slo) for r in counted)
    return {
        "slo": slo.values(),
        "good_requests": good,
        "requests_per_s": good / duration_s if duration_s > 0 else 0.0,
        "attainment_pct": 100.0 * good / len(counted) if counted else 0.0,
    }


def cost(duration_s: float, price_per_hour: float | None, output_tokens: int, completed: int,
         total_tokens: int = 0) -> dict[str, Any] | None:
    """Wall-clock cost of the run, in the price's currency (USD for tokenmill's)."""
    if price_per_hour is None:
        return None
    total = duration_s / 3600.0 * price_per_hour
    return {
        "price_per_hour": price_per_hour,
        "total": total,
        "per_million_output_tokens": total / output_tokens * 1e6 if output_tokens else None,
        "per_million_total_tokens": total / total_tokens * 1e6 if total_tokens else None,
        "per_request": total / completed if completed else None,
    }


def parse_prometheus(text: str | None) -> dict[str, float]:
    """Sums over labels of the server samples we use, keyed by full name (e.g.
    ``tokenmill:prefix_cache_hits_total``); {} if absent or unparsable."""
    if not text:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {p + n for p in SERVER_PREFIXES for n in SERVER_SAMPLES}
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted:
                    sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    except (ValueError, TypeError):
        return {}
    return sums


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Queue time, prefix-cache hit rate, preemptions and generated tokens over the run, from two
    scrapes (a series missing from the first scrape counts from 0). The first prefix of
    `SERVER_PREFIXES` with samples in `after` is used."""
    prefix = next((p for p in SERVER_PREFIXES if any(k.startswith(p) for k in after)), None)
    if prefix is None:
        return None
    d = {k[len(prefix):]: v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix)}
    out: dict[str, float] = {}
    if d.get(QUEUE_COUNT, 0) > 0 and QUEUE_SUM in d:
        out["mean_queue_time_ms"] = 1000.0 * d[QUEUE_SUM] / d[QUEUE_COUNT]
        out["queued_requests"] = d[QUEUE_COUNT]
    if d.get(PREFIX_QUERIES, 0) > 0 and PREFIX_HITS in d:
        out["prefix_cache_hit_rate"] = d[PREFIX_HITS] / d[PREFIX_QUERIES]
        out["prefix_cache_queries"] = d[PREFIX_QUERIES]
    if PREEMPTIONS in d:
        out["preemptions"] = d[PREEMPTIONS]
    if GENERATION_TOKENS in d:
        out["generation_tokens"] = d[GENERATION_TOKENS]
    return out or None


def error_counts(results: Iterable[RequestResult], top: int = 10) -> dict[str, int]:
    errors = Counter(r.error for r in results if not r.success and r.error != INTERRUPTED)
    return dict(errors.most_common(top))


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    num_requests: int,
    slo: SLO = SLO(),
    price_per_hour: float | None = None,
    server: dict[str, float] | None = None,
) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    interrupted = sum(r.error == INTERRUPTED for r in results)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.input_len for r in ok)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    tpots = [t for t in map(request_tpot, ok) if t is not None]
    return {
        "num_requests": num_requests,
        "sent": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok) - interrupted,
        "interrupted": interrupted,
        "not_sent": num_requests - len(results),
        "errors": error_counts(results),
        "usage_missing": sum(not r.usage_reported for r in ok),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        "ttft_ms": latency_stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": latency_stats(tpots),
        "itl_ms": latency_stats([g for r in ok for g in r.itl_s]),
        "e2e_ms": latency_stats([r.e2e_s for r in ok if r.e2e_s is not None]),
        "goodput": goodput(results, slo, duration_s),
        "cost": cost(duration_s, price_per_hour, out_tokens, len(ok), in_tokens + out_tokens),
        "server": server,
    }
