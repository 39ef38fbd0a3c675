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
from tokenmill.bench.price import PriceChoice
from tokenmill.bench.serve_args import extra_body, parse_rates, validate, workload_opts
from tokenmill.bench.slos import SLOChoice, choose_slo
from tokenmill.bench.workloads import WORKLOADS, BenchRequest, PromptBuilder, load_tokenizer, make_workload


@dataclass
class Plan:
    cfg: EndpointConfig
    requests: list[BenchRequest]
    rates: list[float | None]  # None: replay the trace's timestamps
    burstiness: float
    max_concurrency: int | None
    seed: int
    slo: SLOChoice
    price: PriceChoice | None  # None: read from the server before the first run (`set_price`)
    out: Path
    progress: bool
    meta: dict[str, Any] = field(default_factory=dict)
    # the requests of the i-th run of a sweep: same lengths, new prompt text (see make_workload)
    variant: Callable[[int], list[BenchRequest]] | None = None

    def requests_for(self, index: int) -> list[BenchRequest]:
        return self.requests if index == 0 or self.variant is None else self.variant(index)

    def set_price(self, price: PriceChoice) -> None:
        self.price = price
        self.meta.update(price_per_hour=price.per_hour, price_source=price.source)
        if price.per_hour is None:
            self.meta["cost_note"] = price.note

    def describe(self) -> str:
        """What is about to be measured, and against which SLOs and price (defaults marked)."""
        endpoint = self.cfg.url.removeprefix(self.cfg.base_url.rstrip("/"))
        if self.meta.get("endpoint_source") == "default":
            endpoint += f" (default for --workload {self.meta['workload']})"
        price = self.price.describe() if self.price else "-"
        return "\n".join([
            f"model: {self.cfg.model} at {self.cfg.base_url}{endpoint}",
            f"SLOs: {self.slo.describe()}",
            f"price: {price}",
        ])


def default_endpoint(workload: str) -> str:
    return "chat" if workload == "chat" else "completions"


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

    endpoint = args.endpoint or default_endpoint(args.workload)
    cfg = EndpointConfig(args.base_url, args.model or "", endpoint, args.ignore_eos,
                         args.api_key, extra_body(args.extra_body), args.timeout)
    out = Path(args.out or Path("out") / "bench" / datetime.now().strftime("%Y%m%d-%H%M%S"))
    slo = choose_slo(args.workload, {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms,
                                     "e2e_ms": args.slo_e2e_ms})
    price = None if args.price_per_hour is None else PriceChoice(args.price_per_hour, "flag")
    plan = Plan(cfg, requests, rates, args.burstiness, args.max_concurrency, args.seed, slo,
                price, out, not args.disable_tqdm, variant=variant)
    plan.meta = plan_meta(args, opts, len(requests), len(rates) > 1, slo)
    if price is not None:
        plan.set_price(price)
    return plan


def plan_meta(args: argparse.Namespace, opts: dict[str, str], num_requests: int, sweep: bool,
              slo: SLOChoice) -> dict[str, Any]:
    return {
        "command": command_line(),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "base_url": args.base_url,
        "endpoint": args.endpoint or default_endpoint(args.workload),
        "endpoint_source": "flag" if args.endpoint else "default",
        "workload": args.workload,
        "workload_opts": opts,
        "num_requests": num_requests,
        "prompts": "new text for each rate of the sweep, same lengths" if sweep else None,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "ignore_eos": args.ignore_eos,
        "tokenizer": args.tokenizer,
        "slo": slo.slo.values(),
        "slo_source": dict(slo.sources),
        "slo_defaults_for": slo.workload,
        "price_per_hour": None,
        "price_source": None,
        "args": {k: v for k, v in vars(args).items() if not callable(v) and k != "api_key"},
    }
