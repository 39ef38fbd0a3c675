"""`tokenmill bench serve` / `tokenmill bench compare`: a serving benchmark for any
OpenAI-compatible endpoint (in the manner of `vllm bench serve`).

    python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8000 --workload chat \\
        --sweep 1,2,4,8 --slo-ttft-ms 500 --slo-tpot-ms 50 --price-per-hour 3.5 --out out/run1
    python -m tokenmill.bench.serve compare out/run1 out/run2

Metric definitions: see `tokenmill.bench.metrics`. Workloads and arrivals: see
`tokenmill.bench.workloads`. Timing and token counting: see `tokenmill.bench.client`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tokenmill.bench.client import (
    INTERRUPTED,
    EndpointConfig,
    RequestResult,
    fetch_metrics,
    list_models,
    stream_request,
)
from tokenmill.bench.metrics import QUEUE_COUNT, SLO, parse_prometheus, server_delta, summarize
from tokenmill.bench.report import compare_runs, rate_label, sweep_markdown, write_run, write_sweep
from tokenmill.bench.workloads import (
    WORKLOADS,
    BenchError,
    BenchRequest,
    PromptBuilder,
    arrival_offsets,
    load_tokenizer,
    make_workload,
    trace_offsets,
)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# ---------------------------------------------------------------- argument parsers


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="benchmark an OpenAI-compatible server",
        description="Benchmark an OpenAI-compatible streaming endpoint: latency (TTFT, TPOT, ITL, "
        "E2E), throughput, goodput under SLOs and cost per token.",
    )
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default: %(default)s)")
    p.add_argument("--model", help="model name to send (default: the first id from /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default: %(default)s)")
    p.add_argument("--workload", default="random",
                   help=f"one of {', '.join(WORKLOADS)}, or a JSONL trace file with timestamp, "
                   "input_len or text, output_len per line (default: %(default)s)")
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
    p.add_argument("--slo-ttft-ms", type=float, help="TTFT SLO for goodput")
    p.add_argument("--slo-tpot-ms", type=float, help="TPOT SLO for goodput")
    p.add_argument("--slo-e2e-ms", type=float, help="end-to-end latency SLO for goodput")
    p.add_argument("--price-per-hour", type=float, help="price of the serving machine per hour, for cost")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (for servers that reject unknown fields)")
    p.add_argument("--extra-body", metavar="JSON", help="extra JSON fields merged into every request")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: %(default)s)")
    p.add_argument("--out", help="output folder (default: out/bench/<date-time>)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.set_defaults(func=run_serve)
    return p


def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare", help="compare two benchmark runs side by side",
        description="Print two runs' summaries (results.json, sweep.json or their folders) side by "
        "side with ratios B/A.")
    p.add_argument("run_a", help="baseline run")
    p.add_argument("run_b", help="run compared to the baseline")
    p.set_defaults(func=run_compare)
    return p


# ---------------------------------------------------------------- planning


@dataclass
class Plan:
    cfg: EndpointConfig
    requests: list[BenchRequest]
    rates: list[float | None]  # None: replay the trace's timestamps
    burstiness: float
    max_concurrency: int | None
    seed: int
    slo: SLO
    price_per_hour: float | None
    out: Path
    progress: bool
    meta: dict[str, Any] = field(default_factory=dict)
    # the requests of the i-th run of a sweep: same lengths, new prompt text (see make_workload)
    variant: Callable[[int], list[BenchRequest]] | None = None

    def requests_for(self, index: int) -> list[BenchRequest]:
        return self.requests if index == 0 or self.variant is None else self.variant(index)


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
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "timeout"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
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


def command_line() -> str:
    argv = list(sys.argv)
    if argv and argv[0].endswith(("bench/serve.py", "bench\\serve.py")):
        argv[:1] = ["python", "-m", "tokenmill.bench.serve"]
    return shlex.join(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    validate(args)
    opts = workload_opts(args)
    is_trace = args.workload not in WORKLOADS
    rates = parse_rates(args, is_trace)
    builder = PromptBuilder(load_tokenizer(args.tokenizer) if args.tokenizer else None)
    requests = make_workload(args.workload, args.num_requests, args.seed, builder, opts)

    def variant(index: int) -> list[BenchRequest]:
        return make_workload(args.workload, args.num_requests, args.seed, builder, opts, variant=index)

    cfg = EndpointConfig(args.base_url, args.model or "", args.endpoint, args.ignore_eos,
                         args.api_key, extra_body(args.extra_body), args.timeout)
    out = Path(args.out or Path("out") / "bench" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
    plan = Plan(cfg, requests, rates, args.burstiness, args.max_concurrency, args.seed, slo,
                args.price_per_hour, out, not args.disable_tqdm, variant=variant)
    plan.meta = {
        "command": command_line(),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "workload": args.workload,
        "workload_opts": opts,
        "num_requests": len(requests),
        "prompts": "new text for each rate of the sweep, same lengths" if len(rates) > 1 else None,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "ignore_eos": args.ignore_eos,
        "tokenizer": args.tokenizer,
        "slo": {k: v for k, v in vars(slo).items() if v is not None},
        "price_per_hour": args.price_per_hour,
        "args": {k: v for k, v in vars(args).items() if not callable(v) and k != "api_key"},
    }
    return plan


# ---------------------------------------------------------------- running


@dataclass
class RunState:
    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0
    server: dict[str, float] | None = None


def offsets_for(plan: Plan, requests: list[BenchRequest], rate: float | None) -> np.ndarray:
    if rate is None:
        return trace_offsets(requests)
    rng = np.random.default_rng([plan.seed, 1])  # same draws for every rate of a sweep
    return arrival_offsets(len(requests), rate, plan.burstiness, rng)


async def _send(
    client: httpx.AsyncClient, plan: Plan, req: BenchRequest, res: RequestResult, t0: float,
    sem: asyncio.Semaphore | None, pbar: Any, failed: list[int],
) -> None:
    try:
        if sem is None:
            await stream_request(client, plan.cfg, req, res, t0)
        else:
            async with sem:
                await stream_request(client, plan.cfg, req, res, t0)
    except asyncio.CancelledError:
        res.error = res.error or INTERRUPTED
        raise
    if not res.success:
        failed[0] += 1
        pbar.set_postfix(failed=failed[0], refresh=False)
    pbar.update(1)


async def _dispatch(client: httpx.AsyncClient, plan: Plan, requests: list[BenchRequest], offsets: np.ndarray,
                    state: RunState, desc: str) -> None:
    from tqdm import tqdm

    sem = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    pbar = tqdm(total=len(requests), desc=desc, unit="req", disable=not plan.progress)
    tasks: list[asyncio.Task] = []
    failed = [0]
    t0 = time.perf_counter()
    try:
        for i, (req, off) in enumerate(zip(requests, offsets)):
            delay = t0 + float(off) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            res = RequestResult(i, req.input_len, req.output_len, float(off))
            state.results.append(res)
            tasks.append(asyncio.create_task(_send(client, plan, req, res, t0, sem, pbar, failed)))
        await asyncio.gather(*tasks)
    finally:
        state.duration_s = time.perf_counter() - t0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pbar.close()


async def run_rate(plan: Plan, requests: list[BenchRequest], rate: float | None, state: RunState) -> None:
    timeout = httpx.Timeout(plan.cfg.timeout_s, connect=min(plan.cfg.timeout_s, 30.0))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        before_text = await fetch_metrics(client, plan.cfg.base_url)
        desc = "trace replay" if rate is None else f"rate {rate_label(rate)}"
        await _dispatch(client, plan, requests, offsets_for(plan, requests, rate), state, desc)
        if before_text is not None:  # no /metrics before: no baseline, no deltas
            state.server = await scrape_after(client, plan.cfg.base_url, parse_prometheus(before_text),
                                              sum(r.success for r in state.results))


async def scrape_after(client: httpx.AsyncClient, base_url: str, before: dict[str, float], completed: int,
                       settle_s: float = 2.0) -> dict[str, Any] | None:
    """Server deltas over the run. A server may count a finished request in its histograms a
    moment after the stream ends, so while the queue-time count lags the completed requests we
    scrape again, for at most `settle_s`."""
    deadline = time.perf_counter() + settle_s
    while True:
        after = parse_prometheus(await fetch_metrics(client, base_url))
        delta = server_delta(before, after)
        has_queue = any(k.endswith(QUEUE_COUNT) for k in after)
        lagging = has_queue and (delta or {}).get("queued_requests", 0) < completed
        if not lagging or time.perf_counter() >= deadline:
            return delta
        await asyncio.sleep(0.1)


async def resolve_model(plan: Plan) -> None:
    async with httpx.AsyncClient() as client:
        models = await list_models(client, plan.cfg.base_url, plan.cfg.headers)
    if not plan.cfg.model:
        if not models:
            raise BenchError(f"no --model given and {plan.cfg.base_url}/v1/models lists none")
        plan.cfg.model = models[0]
    plan.meta["model"] = plan.cfg.model


def run_one(plan: Plan, rate: float | None, index: int = 0) -> tuple[RunState, dict[str, Any], bool]:
    """One benchmark at one rate (the `index`-th of a sweep); Ctrl-C stops it and keeps what was
    measured."""
    state = RunState()
    interrupted = False
    requests = plan.requests_for(index)
    try:
        asyncio.run(run_rate(plan, requests, rate, state))
    except KeyboardInterrupt:
        interrupted = True
    summary = summarize(state.results, state.duration_s, len(requests), plan.slo,
                        plan.price_per_hour, state.server)
    return state, summary, interrupted


def arrivals(plan: Plan, rate: float | None) -> str:
    cap = f", at most {plan.max_concurrency} in flight" if plan.max_concurrency else ""
    if rate is None:
        return "trace timestamps" + cap
    if math.isinf(rate):
        return f"closed loop, {plan.max_concurrency} in flight" if plan.max_concurrency else "all at once"
    if plan.burstiness == 1:
        return f"Poisson, {rate:g} req/s" + cap
    return f"gamma, {rate:g} req/s, CV {plan.burstiness:g}" + cap


def run_meta(plan: Plan, rate: float | None, interrupted: bool) -> dict[str, Any]:
    return {**plan.meta, "request_rate": rate, "arrivals": arrivals(plan, rate), "interrupted": interrupted}


def execute(plan: Plan) -> int:
    asyncio.run(resolve_model(plan))
    rows: list[tuple[float | None, dict[str, Any]]] = []
    by_rate: dict[str, list[RequestResult]] = {}
    sweep = len(plan.rates) > 1
    interrupted = False
    for index, rate in enumerate(plan.rates):
        state, summary, interrupted = run_one(plan, rate, index)
        out = plan.out / f"rate_{rate_label(rate).replace(',', '')}" if sweep else plan.out
        write_run(out, state.results, summary, run_meta(plan, rate, interrupted))
        rows.append((rate, summary))
        by_rate[rate_label(rate)] = state.results
        if interrupted:
            break
    if sweep:
        write_sweep(plan.out, rows, by_rate, {**plan.meta, "interrupted": interrupted})
    print((plan.out / "report.md").read_text(encoding="utf-8") if not sweep else sweep_markdown(rows))
    print(f"\nresults written to {plan.out}")
    if interrupted:
        print(f"interrupted: partial results written to {plan.out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if all(s["completed"] == 0 for _, s in rows):
        print("error: no request succeeded (see errors in report.md)", file=sys.stderr)
        return 1
    return 0


def _fail(command: str, e: Exception) -> int:
    print(f"tokenmill bench {command}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return EXIT_USAGE


def run_serve(args: argparse.Namespace) -> int:
    try:
        return execute(make_plan(args))
    except (BenchError, OSError) as e:
        return _fail("serve", e)
    except KeyboardInterrupt:
        print("tokenmill bench serve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run_compare(args: argparse.Namespace) -> int:
    try:
        print(compare_runs(args.run_a, args.run_b))
    except BenchError as e:
        return _fail("compare", e)
    return 0


# ---------------------------------------------------------------- standalone entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill bench", description="Serving benchmarks.")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_serve_parser(sub)
    add_compare_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tokenmill.bench.serve [serve] ARGS` or `... compare A B`."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in ("serve", "compare", "-h", "--help"):
        args_list.insert(0, "serve")
    args = build_parser().parse_args(args_list)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
