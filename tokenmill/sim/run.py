"""`tokenmill sim`: a `bench serve` run, simulated. Same workload, arrival, SLO, price and output
flags (the harness's own Plan), so results.json / report.md have the same form and `tokenmill bench
compare` sets a simulated run beside a measured one."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from typing import Any

from tokenmill.bench.metrics import summarize
from tokenmill.bench.plan import Plan, make_plan
from tokenmill.bench.price import PriceChoice
from tokenmill.bench.fmt import rate_label
from tokenmill.bench.report import sweep_markdown, write_run, write_sweep
from tokenmill.bench.runner import arrivals, offsets_for
from tokenmill.bench.workloads import BenchError, BenchRequest, load_tokenizer
from tokenmill.sim.cluster import ClusterConfig, build_cluster
from tokenmill.sim.hardware import Hardware, get_hardware, load_hardware, load_profile
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.simulator import ClusterSimulator, SimResult
from tokenmill.sim.workload import TokenCounter, run_duration, to_request_results, to_sim_requests

TITLE = "tokenmill sim (simulated)"


@dataclass
class Source:
    """Where step times come from: a measured profile, or a device's datasheet."""
    shape: ModelShape
    profile: dict[str, Any] | None = None
    hardware: dict[str, Hardware] | None = None
    device: str | None = None

    def describe(self) -> str:
        if self.profile is not None:
            return f"profile measured on {self.profile.get('cpu')} ({self.profile.get('date')})"
        hw = self.hardware[self.device]
        return f"datasheet {hw.name} (price {hw.price_per_hour}/h: {hw.price_source})"


def resolve_source(args: argparse.Namespace) -> Source:
    if args.hardware and args.profile:
        raise ValueError("give --profile (measured) or --hardware (datasheet), not both")
    if args.hardware:
        device = get_hardware(args.hardware, args.hardware_file)[0].key
        shape = ModelShape.from_folder(args.model or _default_model_folder())
        return Source(shape, hardware=load_hardware(args.hardware_file), device=device)
    profile = load_profile(args.profile)
    shape = ModelShape.from_folder(args.model) if args.model else ModelShape(**profile["model_shape"])
    return Source(shape, profile=profile)


def _default_model_folder() -> str:
    from tokenmill.models.default_model import resolve_default_model
    return str(resolve_default_model())


def simulate(source: Source, cfg: ClusterConfig, requests: list[BenchRequest], offsets: Any,
             tokens: TokenCounter, price_per_replica: float = 0.0, elastic: Any = None,
             min_remote_prefill_tokens: int = 256) -> tuple[ClusterSimulator, list[SimResult]]:
    """`elastic`: an `SLAPlannerConfig`, to let the profile planner move replicas between pools."""
    specs, link = build_cluster(cfg, source.shape, source.hardware, source.device, source.profile,
                                price_per_replica)
    if elastic is None:
        sim = ClusterSimulator(specs, cfg.router, transfer=link)
    else:
        from tokenmill.disagg.role_profile import role_profile_from_perf
        from tokenmill.disagg.sla_planner import ProfilePlanner
        from tokenmill.sim.elastic import ElasticClusterSimulator
        role = role_profile_from_perf(specs[0].perf, cfg.max_num_batched_tokens,
                                      specs[-1].num_kv_blocks * cfg.block_size, cfg.max_num_seqs, source.describe())
        sim = ElasticClusterSimulator(specs, ProfilePlanner(elastic, role), link, min_remote_prefill_tokens,
                                      cfg.router)
    return sim, sim.run(to_sim_requests(requests, offsets, tokens))


def server_stats(sim: ClusterSimulator) -> dict[str, float]:
    """What `bench serve` scrapes from a server's /metrics, from the simulated engines."""
    queries = sum(r.core.prefix_stats.queries for r in sim.replicas)
    hits = sum(r.core.prefix_stats.hits for r in sim.replicas)
    out = {"preemptions": float(sum(r.core.scheduler.num_preemptions for r in sim.replicas))}
    if queries:
        out.update(prefix_cache_hit_rate=hits / queries, prefix_cache_queries=float(queries))
    return out


def run_rate(plan: Plan, source: Source, cfg: ClusterConfig, tokens: TokenCounter, rate: float | None,
             index: int, elastic: Any = None,
             min_remote_prefill_tokens: int = 256) -> tuple[Any, dict[str, Any], ClusterSimulator, float]:
    requests = plan.requests_for(index)
    t0 = time.perf_counter()
    sim, sims = simulate(source, cfg, requests, offsets_for(plan, requests, rate), tokens,
                         plan.price.per_hour if plan.price and source.profile is not None else 0.0, elastic,
                         min_remote_prefill_tokens)
    wall = time.perf_counter() - t0
    results = to_request_results(sims, requests)
    price = cluster_price(plan, source, sim)
    summary = summarize(results, run_duration(sims), len(requests), plan.slo.slo, price.per_hour,
                        server_stats(sim))
    plan.slo.annotate(summary)
    price.annotate(summary)
    return results, summary, sim, wall


def cluster_price(plan: Plan, source: Source, sim: ClusterSimulator) -> PriceChoice:
    if source.profile is None:  # datasheet devices: the profile file's price unless --price-per-hour
        if plan.price is not None and plan.price.per_hour is not None:
            return PriceChoice(plan.price.per_hour * sum(s.spec.perf.tp for s in sim.replicas), "flag")
        return PriceChoice(sim.price_per_hour, "hardware profile")
    if plan.price is None or plan.price.per_hour is None:
        return PriceChoice(None, "none", "no --price-per-hour given for the measured profile's machine")
    return PriceChoice(sim.price_per_hour, "flag")


def run_sim(args: argparse.Namespace) -> int:
    if args.max_concurrency is not None:
        raise BenchError("--max-concurrency (closed-loop clients) is not simulated; give --request-rate")
    from tokenmill.sim.args import cluster_config, elastic_config

    source = resolve_source(args)
    cfg = cluster_config(args)
    elastic = elastic_config(args)
    plan = make_plan(args)
    plan.meta.update(simulated=source.describe(), base_url=None, model=source.shape.name, cluster=cfg.label(),
                     endpoint=plan.cfg.endpoint)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    tokens = TokenCounter(tokenizer, chat=plan.cfg.endpoint == "chat")
    rows, by_rate = [], {}
    sweep = len(plan.rates) > 1
    for index, rate in enumerate(plan.rates):
        results, summary, sim, wall = run_rate(plan, source, cfg, tokens, rate, index, elastic,
                                               getattr(args, "min_remote_prefill_tokens", 256))
        meta = {**plan.meta, "request_rate": rate, "arrivals": arrivals(plan, rate), "interrupted": False,
                "sim_wall_s": wall, "replica_utilisation": sim.utilisation()}
        if elastic is not None:
            meta["planner_moves"] = [{"time_s": t, "replica": i, "to": role, "reason": why}
                                     for t, i, role, why in sim.moves]
            print(f"rate {rate_label(rate)}: {len(sim.moves)} planner moves; prefill/decode replicas over time: "
                  + " ".join(f"{p}:{d}" for _, p, d in sim.pool_sizes[::max(1, len(sim.pool_sizes) // 12)]))
        out = plan.out / f"rate_{rate_label(rate).replace(',', '')}" if sweep else plan.out
        write_run(out, results, summary, meta, TITLE)
        rows.append((rate, summary))
        by_rate[rate_label(rate)] = results
    if sweep:
        write_sweep(plan.out, rows, by_rate, {**plan.meta, "interrupted": False}, TITLE)
    print(f"simulated: {source.describe()}; cluster {cfg.label()}")
    print((plan.out / "report.md").read_text(encoding="utf-8") if not sweep else sweep_markdown(rows))
    print(f"\nresults written to {plan.out}")
    return 0


def main_sim(args: argparse.Namespace) -> int:
    try:
        return run_sim(args)
    except (BenchError, ValueError, OSError) as e:
        print(f"tokenmill sim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


