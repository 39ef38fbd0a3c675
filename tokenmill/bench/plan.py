"""A `bench serve` run planned from its arguments: endpoint, workload, rates, SLOs, price, output."""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenmill.bench.client import EndpointConfig
from tokenmill.bench.metrics import SLO
from tokenmill.bench.serve_args import extra_body, parse_rates, validate, workload_opts
from tokenmill.bench.workloads import WORKLOADS, BenchRequest, PromptBuilder, load_tokenizer, make_workload


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
