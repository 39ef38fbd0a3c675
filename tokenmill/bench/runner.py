"""Running a planned benchmark: send the requests on schedule, scrape the server, write the results."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from tokenmill.bench.client import INTERRUPTED, RequestResult, fetch_metrics, list_models, stream_request
from tokenmill.bench.metrics import QUEUE_COUNT, parse_prometheus, server_delta, summarize
from tokenmill.bench.plan import Plan
from tokenmill.bench.price import PriceChoice, choose_price
from tokenmill.bench.fmt import rate_label
from tokenmill.bench.report import sweep_markdown, write_run, write_sweep
from tokenmill.bench.arrivals import arrival_offsets, trace_offsets
from tokenmill.bench.workloads import BenchError, BenchRequest

EXIT_INTERRUPTED = 130


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


async def probe_server(plan: Plan) -> None:
    """The model to send (unless --model) and the price (unless --price-per-hour), from the server."""
    async with httpx.AsyncClient() as client:
        models = await list_models(client, plan.cfg.base_url, plan.cfg.headers)
        if plan.price is None:
            metrics = await fetch_metrics(client, plan.cfg.base_url)
            plan.set_price(choose_price(None, metrics, plan.cfg.base_url))
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
    price = plan.price or PriceChoice(None, "none")
    summary = summarize(state.results, state.duration_s, len(requests), plan.slo.slo,
                        price.per_hour, state.server)
    plan.slo.annotate(summary)
    price.annotate(summary)
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
    asyncio.run(probe_server(plan))
    print(plan.describe(), flush=True)
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
