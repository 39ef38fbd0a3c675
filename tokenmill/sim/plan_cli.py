"""`tokenmill plan`: the cheapest cluster configurations that meet a latency SLO for a workload,
found by simulating each candidate on the real scheduler (`planner.search`), with the seeds' levers
side by side. Writes plan.md, plan.json and plots to --out."""
from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.bench.fmt import md_table
from tokenmill.bench.metrics import latency_stats, percentile
from tokenmill.sim.cluster import ClusterConfig, build_cluster
from tokenmill.sim.hardware import get_hardware, load_hardware
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.planner import Evaluation, SLOTerm, parse_slo, search
from tokenmill.sim.simulator import ClusterSimulator, SimRequest, SimResult


def add_plan_args(p: argparse.ArgumentParser) -> None:
    from tokenmill.bench.serve_args import add_serve_arguments
    p.add_argument("--model", required=True, help="Hugging Face model folder (config.json is read)")
    p.add_argument("--trace", help="JSONL trace to plan for (same as --workload FILE)")
    add_serve_arguments(p, endpoint=False)
    p.add_argument("--slo", required=True, help='e.g. "ttft_p99<=2s,tpot_p99<=100ms"')
    p.add_argument("--hardware", default="h100,a100", help="devices to consider (default: %(default)s)")
    p.add_argument("--hardware-file", help="your own hardware profiles YAML")
    p.add_argument("--tp", default="1,2,4,8", help="TP degrees to consider (default: %(default)s)")
    p.add_argument("--batch-tokens", default="2048,8192", help="max_num_batched_tokens values (default: %(default)s)")
    p.add_argument("--weight-dtypes", default="bfloat16,int4", help="(default: %(default)s)")
    p.add_argument("--kv-dtypes", default="bfloat16,int8", help="(default: %(default)s)")
    p.add_argument("--kv-memory", default="1.0", help="shares of free memory given to KV (default: %(default)s)")
    p.add_argument("--pd-ratios", default="none,1:1,1:2", help="prefill:decode ratios, 'none' = unified "
                   "(default: %(default)s)")
    p.add_argument("--mixed", action="store_true", help="also try prefill on one device and decode on another")
    p.add_argument("--max-replicas", type=int, default=32, help="per structure (default: %(default)s)")
    p.add_argument("--top", type=int, default=10, help="configurations to print (default: %(default)s)")


@dataclass(frozen=True)
class Structure:
    device: str
    decode_device: str | None
    cfg: ClusterConfig  # replicas / prefill / decode counts are per unit here
    pd: tuple[int, int] | None

    def at(self, units: int) -> ClusterConfig:
        if self.pd is None:
            return replace(self.cfg, replicas=units)
        return replace(self.cfg, prefill_replicas=self.pd[0] * units, decode_replicas=self.pd[1] * units)

    def label(self, units: int) -> str:
        mix = f"{self.device}" + (f"->{self.decode_device}" if self.decode_device else "")
        return f"{mix} {self.at(units).label()}"


def _list(text: str, cast=str) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def structures(args: argparse.Namespace, shape: ModelShape) -> list[Structure]:
    devices = [h.key for h in get_hardware(args.hardware, args.hardware_file)]
    table = load_hardware(args.hardware_file)
    out = []
    pds = [None if r == "none" else tuple(int(x) for x in r.split(":")) for r in _list(args.pd_ratios)]
    pairs = [(d, None) for d in devices]
    if args.mixed:
        pairs += [(a, b) for a, b in itertools.permutations(devices, 2)]
    for (dev, dec), tp, bt, w, kv, mem, pd in itertools.product(
            pairs, _list(args.tp, int), _list(args.batch_tokens, int), _list(args.weight_dtypes),
            _list(args.kv_dtypes), _list(args.kv_memory, float), pds):
        if dec and pd is None:
            continue
        cfg = ClusterConfig(tp=tp, max_num_batched_tokens=bt, max_num_seqs=256, weight_dtype=w, kv_dtype=kv,
                            kv_memory_fraction=mem, decode_hardware=dec,
                            prefill_replicas=pd[0] if pd else 0, decode_replicas=pd[1] if pd else 0)
        if _fits(table[dev], shape, cfg) and (dec is None or _fits(table[dec], shape, cfg)):
            out.append(Structure(dev, dec, cfg, pd))
    return _smallest_tps(out)


def _fits(hw, shape: ModelShape, cfg: ClusterConfig) -> bool:
    return shape.weight_bytes(cfg.weight_dtype) < 0.8 * hw.usable_memory_bytes() * cfg.tp


def _smallest_tps(structs: list[Structure]) -> list[Structure]:
    """Per everything-but-TP, the two smallest TP degrees that fit (more only adds all-reduces)."""
    groups: dict[Any, list[Structure]] = {}
    for s in structs:
        groups.setdefault((s.device, s.decode_device, replace(s.cfg, tp=1), s.pd), []).append(s)
    return [s for g in groups.values() for s in sorted(g, key=lambda s: s.cfg.tp)[:2]]


class SimEvaluator:
    def __init__(self, shape: ModelShape, hardware: dict, requests: list[SimRequest], slo: list[SLOTerm],
                 out_tokens: int, in_tokens: int) -> None:
        self.shape, self.hardware, self.requests, self.slo = shape, hardware, requests, slo
        self.out_tokens, self.in_tokens = out_tokens, in_tokens

    def __call__(self, s: Structure, units: int) -> Evaluation:
        cfg = s.at(units)
        specs, link = build_cluster(cfg, self.shape, self.hardware, s.device)
        sim = ClusterSimulator(specs, cfg.router, transfer=link)
        res = sim.run(self.requests)
        m = self.metrics(sim, res)
        meets = all(m[t.key] is not None and m[t.key] <= t.limit_ms for t in self.slo)
        return Evaluation(s, units, sim.price_per_hour, meets, m)

    def metrics(self, sim: ClusterSimulator, res: list[SimResult]) -> dict[str, Any]:
        span = max(r.token_times[-1] for r in res) - min(r.arrival for r in res)
        lat = {"ttft": [r.ttft for r in res], "e2e": [r.e2e for r in res],
               "tpot": [(r.e2e - r.ttft) / (r.output_len - 1) for r in res if r.output_len > 1],
               "itl": [b - a for r in res for a, b in zip(r.token_times, r.token_times[1:])]}
        m: dict[str, Any] = {}
        for name, values in lat.items():
            for q in sorted({50.0, 99.0, *[t.percentile for t in self.slo if t.metric == name]}):
                v = percentile(values, q)
                m[f"{name}_ms.p{q:g}"] = None if v is None else 1000 * v
        good = sum(all(_request_meets(r, t) for t in self.slo) for r in res)
        dollars = sim.price_per_hour * span / 3600
        busy = sum(r.executor.busy_time for r in sim.replicas) or 1.0
        prefill = sum(r.executor.prefill_time for r in sim.replicas) / busy
        m.update(attainment_pct=100 * good / len(res), goodput_rps=good / span, duration_s=span,
                 output_tok_s=self.out_tokens / span, dollars=dollars,
                 usd_per_m_input=dollars * prefill / self.in_tokens * 1e6,
                 usd_per_m_output=dollars * (1 - prefill) / self.out_tokens * 1e6,
                 goodput_per_dollar=good / dollars if dollars else None,
                 binding=binding_constraint(sim, res, self.slo, m))
        return m


def _request_meets(r: SimResult, t: SLOTerm) -> bool:
    """Per-request check for goodput (a percentile SLO is met by the run; goodput counts requests)."""
    v = {"ttft": r.ttft, "e2e": r.e2e, "tpot": (r.e2e - r.ttft) / max(1, r.output_len - 1),
         "itl": max((b - a for a, b in zip(r.token_times, r.token_times[1:])), default=0.0)}[t.metric]
    return 1000 * v <= t.limit_ms


def binding_constraint(sim: ClusterSimulator, res: list[SimResult], slo: list[SLOTerm], m: dict) -> str:
    """What limits this configuration: KV capacity (preemptions), queueing (TTFT mostly waiting),
    else the dominant share of step time: compute or HBM bandwidth (or communication)."""
    if sum(r.num_preemptions for r in res):
        return "KV capacity"
    tight = max(slo, key=lambda t: (m.get(t.key) or 0.0) / t.limit_ms)
    if tight.metric == "ttft" and np.mean([r.queue_time for r in res]) > 0.5 * np.mean([r.ttft for r in res]):
        return "queueing"
    total: dict[str, float] = {}
    for r in sim.replicas:
        for k, v in r.executor.time_by_class.items():
            total[k] = total.get(k, 0.0) + v
    groups = {"compute": total.get("linear_compute", 0) + total.get("attention_compute", 0),
              "HBM bandwidth": total.get("weight_read", 0) + total.get("kv_read", 0),
              "communication": total.get("communication", 0), "step overhead": total.get("overhead", 0)}
    return max(groups, key=groups.get)


# -- levers ------------------------------------------------------------------------------------------

def lever_variants(base: Structure, units: int) -> list[tuple[str, Structure, int]]:
    cfg = base.cfg
    out = [("chosen configuration", base, units),
           ("continuous batching off", replace(base, cfg=replace(cfg, continuous_batching=False)), units),
           ("prefix caching off" if cfg.enable_prefix_caching else "prefix caching on",
            replace(base, cfg=replace(cfg, enable_prefix_caching=not cfg.enable_prefix_caching)), units),
           ("KV int8" if cfg.kv_dtype != "int8" else "KV bfloat16",
            replace(base, cfg=replace(cfg, kv_dtype="bfloat16" if cfg.kv_dtype == "int8" else "int8")), units),
           ("weight int4" if cfg.weight_dtype != "int4" else "weight bfloat16",
            replace(base, cfg=replace(cfg, weight_dtype="bfloat16" if cfg.weight_dtype == "int4" else "int4")),
            units)]
    if base.pd is None and cfg.tp == 1 and cfg.partitions == 1:
        out.append(("spatial partitioning, 2 per device", replace(base, cfg=replace(cfg, partitions=2)), 2 * units))
    if base.pd is None and units >= 2:
        p = max(1, units // 2)
        pd_cfg = replace(cfg, prefill_replicas=1, decode_replicas=1)
        pd = Structure(base.device, None, pd_cfg, (p, units - p))
        out.append((f"PD disaggregation {p}:{units - p}", pd, 1))
    elif base.pd is not None:
        n = base.pd[0] * units + base.pd[1] * units
        uni = Structure(base.device, None, replace(cfg, prefill_replicas=0, decode_replicas=0), None)
        out.append(("unified (no disaggregation)", uni, n))
    return out


def lever_table(evaluate: SimEvaluator, base: Evaluation) -> tuple[str, list[dict]]:
    rows, records = [], []
    for name, s, units in lever_variants(base.structure, base.units):
        try:
            e = evaluate(s, units)
        except ValueError as err:  # e.g. the variant does not fit the device
            rows.append([name, s.label(units), f"does not run: {err}", "-", "-", "-", "-", "-"])
            continue
        m = e.metrics
        rows.append([name, s.label(units), "yes" if e.meets else "no", m["attainment_pct"], m.get("ttft_ms.p99"),
                     m.get("tpot_ms.p99"), m["output_tok_s"], m["usd_per_m_output"]])
        records.append({"lever": name, "config": s.label(units), "meets": e.meets, **m})
    header = ["Lever", "Configuration", "Meets SLO", "SLO attained (%)", "TTFT p99 (ms)", "TPOT p99 (ms)",
              "Output (tok/s)", "$/1M output tok"]
    return md_table(header, rows), records


# -- report ------------------------------------------------------------------------------------------

def result_rows(best: list[Evaluation], top: int) -> list[list[Any]]:
    rows = []
    for e in best[:top]:
        m = e.metrics
        rows.append([e.structure.label(e.units), e.price_per_hour, m["usd_per_m_input"], m["usd_per_m_output"],
                     m["goodput_per_dollar"], m["attainment_pct"], m.get("ttft_ms.p99"), m.get("tpot_ms.p99"),
                     m["binding"]])
    return rows


RESULT_HEADER = ["Configuration", "$/hour", "$/1M input tok", "$/1M output tok", "Good req per $",
                 "SLO attained (%)", "TTFT p99 (ms)", "TPOT p99 (ms)", "Binding constraint"]


def plot(out: Path, everything: list[Evaluation], best: list[Evaluation], slo: list[SLOTerm]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ok = [e for e in everything if e.meets]
    bad = [e for e in everything if not e.meets]
    ax.scatter([e.price_per_hour for e in bad], [e.metrics["attainment_pct"] for e in bad], c="tab:red", s=14,
               label="misses the SLO")
    ax.scatter([e.price_per_hour for e in ok], [e.metrics["attainment_pct"] for e in ok], c="tab:green", s=14,
               label="meets the SLO")
    pts = sorted((e.price_per_hour, e.metrics["attainment_pct"]) for e in everything)
    frontier, best_y = [], -1.0
    for x, y in pts:
        if y > best_y:
            frontier.append((x, y))
            best_y = y
    if frontier:
        ax.step(*zip(*frontier), where="post", c="k", lw=1, label="frontier")
    ax.set_xscale("log")
    ax.set_xlabel("cluster price ($/hour)")
    ax.set_ylabel("requests meeting every SLO term (%)")
    ax.set_title("cost vs SLO attainment, every configuration simulated")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=110)
    plt.close(fig)
    files = ["frontier.png"]
    if best:
        top = best[:8]
        fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(top) + 2))
        labels = [e.structure.label(e.units) for e in top]
        y = np.arange(len(top))
        for ax, metric in zip(axes, ("ttft", "tpot")):
            for i, (q, c) in enumerate(((50, "tab:blue"), (99, "tab:orange"))):
                ax.barh(y + 0.4 * i, [e.metrics.get(f"{metric}_ms.p{q}") or 0 for e in top], 0.4, color=c,
                        label=f"p{q}")
            for t in slo:
                if t.metric == metric:
                    ax.axvline(t.limit_ms, c="r", ls="--", lw=1)
            ax.set_xlabel(f"{metric.upper()} (ms)")
            ax.legend()
        axes[0].set_yticks(y + 0.2, labels, fontsize=7)
        axes[1].set_yticks([])
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=110)
        plt.close(fig)
        files.append("latency.png")
    return files


def run_plan(args: argparse.Namespace) -> int:
    from tokenmill.bench.plan import make_plan
    from tokenmill.bench.runner import offsets_for
    from tokenmill.bench.workloads import load_tokenizer
    from tokenmill.sim.workload import TokenCounter, to_sim_requests

    if args.trace:
        args.workload = args.trace
    if args.sweep:
        raise ValueError("--sweep: plan for one request rate (give --request-rate)")
    slo = parse_slo(args.slo)
    shape = ModelShape.from_folder(args.model)
    plan = make_plan(args)
    requests = plan.requests_for(0)
    tokens = TokenCounter(load_tokenizer(args.tokenizer) if args.tokenizer else None)
    sims = to_sim_requests(requests, offsets_for(plan, requests, plan.rates[0]), tokens)
    evaluate = SimEvaluator(shape, load_hardware(args.hardware_file), sims, slo,
                            sum(r.output_len for r in sims), sum(len(r.prompt_token_ids) for r in sims))
    structs = structures(args, shape)
    if not structs:
        raise ValueError(f"{shape.name} fits none of --hardware {args.hardware} at --tp {args.tp}")
    print(f"planning {shape.name} ({shape.num_params / 1e9:.1f}B parameters) for {len(sims)} requests "
          f"({plan.meta['workload']}); {len(structs)} structures", flush=True)
    best, everything = search(structs, evaluate, args.max_replicas)
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    table = md_table(RESULT_HEADER, result_rows(best, args.top)) if best else "No configuration meets the SLO."
    levers, lever_records = lever_table(evaluate, best[0] if best else min(
        everything, key=lambda e: -e.metrics["attainment_pct"]))
    plots = plot(out, everything, best, slo)
    text = "\n\n".join([
        "# tokenmill plan", f"- Command: `{plan.meta['command']}`", f"- Model: {shape.name}, "
        f"{shape.num_params / 1e9:.2f}B parameters, KV {shape.kv_bytes_per_token() / 1024:.0f} KiB/token (bf16)",
        f"- Workload: {plan.meta['workload']} {plan.meta['workload_opts']}, {len(sims)} requests, rate "
        f"{plan.rates[0]}", f"- SLO: {', '.join(map(str, slo))}",
        f"- Simulated {len(everything)} configurations ({len(structs)} structures); prices and peaks from "
        "tokenmill/sim/profiles/hardware.yaml (datasheet figures and assumed efficiencies, not measurements)",
        "## Cheapest configurations meeting the SLO", table,
        "## The levers, side by side (same traffic, same replica count)", levers,
        "## Plots", "\n".join(f"![{p}]({p})" for p in plots)])
    (out / "plan.md").write_text(text + "\n", encoding="utf-8")
    (out / "plan.json").write_text(json.dumps({
        "meta": plan.meta, "slo": [str(t) for t in slo],
        "best": [{"config": e.structure.label(e.units), "price_per_hour": e.price_per_hour, **e.metrics}
                 for e in best],
        "levers": lever_records,
        "evaluated": [{"config": e.structure.label(e.units), "price_per_hour": e.price_per_hour, "meets": e.meets,
                       **e.metrics} for e in everything]}, indent=1, default=str) + "\n", encoding="utf-8")
    print(table + "\n\n" + levers + f"\n\nreport written to {out / 'plan.md'}")
    return 0
