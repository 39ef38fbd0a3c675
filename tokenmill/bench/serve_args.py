"""`bench serve`'s command-line arguments and their validation (a bad value is a `BenchError`
naming the flag)."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from tokenmill.bench.workloads import WORKLOADS, BenchError


ENDPOINT_DEFAULTS = {"base_url": "http://127.0.0.1:8000", "model": None, "endpoint": None, "ignore_eos": True,
                     "extra_body": None, "api_key": None, "timeout": 600.0}


def add_serve_arguments(p: argparse.ArgumentParser, endpoint: bool = True) -> argparse.ArgumentParser:
    """The workload, arrival, SLO, price and output flags; with `endpoint`, also the server's (the
    simulator takes the rest without them: `tokenmill sim`)."""
    if endpoint:
        p.add_argument("--base-url", default=ENDPOINT_DEFAULTS["base_url"], help="server root (default: %(default)s)")
        p.add_argument("--model", help="model name to send (default: the first id from /v1/models)")
        p.add_argument("--endpoint", choices=("completions", "chat"),
                       help="/v1/completions or /v1/chat/completions (default: chat for --workload chat, "
                       "else completions)")
    else:
        p.set_defaults(**{k: v for k, v in ENDPOINT_DEFAULTS.items() if k != "model"})
    p.add_argument("--workload", default="random",
                   help=f"one of {', '.join(WORKLOADS)}, or a JSONL trace file with timestamp, "
                   "input_len or text, output_len [, prefix_group, prefix_len] per line (default: %(default)s)")
    p.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload parameter, e.g. long_fraction=0.2 (repeatable)")
    p.add_argument("--input-len", type=int, help="shortcut for --workload-opt input_len=N")
    p.add_argument("--output-len", type=int, help="shortcut for --workload-opt output_len=N")
    p.add_argument("--tokenizer", help="Hugging Face tokenizer folder, so prompt lengths are exact tokens "
                   "(default: a word list at ~1 token per word)")
    p.add_argument("--num-requests", type=int,
                   help="requests to send (default: 200, or every line of a trace)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--request-rate", type=float,
                      help="mean arrivals per second, 'inf' = all at once (default: inf, or the "
                      "trace's timestamps; with --max-concurrency alone: closed loop)")
    rate.add_argument("--sweep", metavar="R1,R2,...", help="run once per request rate and plot against rate")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="coefficient of variation of inter-arrival times: 1 = Poisson, gamma otherwise "
                   "(default: %(default)s)")
    p.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    p.add_argument("--slo-ttft-ms", metavar="MS",
                   help="TTFT SLO for goodput, or 'off' (default: the workload's, see tokenmill/bench/slos.py)")
    p.add_argument("--slo-tpot-ms", metavar="MS", help="TPOT SLO for goodput, or 'off' (default: the workload's)")
    p.add_argument("--slo-e2e-ms", metavar="MS",
                   help="end-to-end latency SLO for goodput, or 'off' (default: none)")
    p.add_argument("--price-per-hour", type=float,
                   help="price of the serving machine per hour (USD), for cost (default: the server's "
                   "tokenmill:price_per_hour_usd from /metrics; without it, no cost)")
    if endpoint:
        p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                       help="do not send ignore_eos (for servers that reject unknown fields)")
        p.add_argument("--extra-body", metavar="JSON", help="extra JSON fields merged into every request")
        p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                       help="bearer token (default: $OPENAI_API_KEY)")
        p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: %(default)s)")
    p.add_argument("--out", help="output folder (default: out/bench/<date-time>)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    return p


def _positive(name: str, value: float | None, allow_zero: bool = False, allow_inf: bool = False) -> None:
    if value is None:
        return
    bad = math.isnan(value) or value < 0 or (value == 0 and not allow_zero)
    if bad or (math.isinf(value) and not allow_inf):
        need = ">= 0" if allow_zero else "> 0"
        raise BenchError(f"{name} must be {need}{'' if allow_inf else ' and finite'}, got {value:g}")


def parse_rates(args: argparse.Namespace, is_trace: bool) -> list[float | None]:
    if args.sweep is not None:
        try:
            rates = [float(x) for x in args.sweep.split(",") if x.strip()]
        except ValueError:
            raise BenchError(f"--sweep must be comma-separated rates, got {args.sweep!r}") from None
        if not rates:
            raise BenchError("--sweep needs at least one rate")
        for r in rates:
            _positive("--sweep rate", r, allow_inf=True)
        return list(rates)
    if args.request_rate is not None:
        _positive("--request-rate", args.request_rate, allow_inf=True)
        return [args.request_rate]
    return [None] if is_trace else [math.inf]


def validate(args: argparse.Namespace) -> None:
    if not args.base_url.startswith(("http://", "https://")):
        raise BenchError(f"--base-url must start with http:// or https://, got {args.base_url!r}")
    if args.num_requests is not None and args.num_requests <= 0:
        raise BenchError(f"--num-requests must be > 0, got {args.num_requests}")
    if args.max_concurrency is not None and args.max_concurrency <= 0:
        raise BenchError(f"--max-concurrency must be > 0, got {args.max_concurrency}")
    _positive("--burstiness", args.burstiness, allow_zero=True)
    _positive("--timeout", args.timeout)
    _positive("--price-per-hour", args.price_per_hour, allow_zero=True)


def workload_opts(args: argparse.Namespace) -> dict[str, str]:
    opts = {}
    for item in args.workload_opt:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BenchError(f"--workload-opt must be KEY=VALUE, got {item!r}")
        opts[key.strip()] = value.strip()
    for key in ("input_len", "output_len"):
        if getattr(args, key) is not None:
            opts[key] = str(getattr(args, key))
    return opts


def extra_body(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise BenchError(f"--extra-body is not valid JSON: {e.msg}") from None
    if not isinstance(body, dict):
        raise BenchError("--extra-body must be a JSON object")
    return body
