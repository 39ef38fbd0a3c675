"""Published results, reproduced in direction and rough size on the simulator (datasheet profiles,
assumed efficiencies: see hardware.yaml). `python -m tokenmill.sim.reproduce {distserve,splitwise}`.

- DistServe (OSDI'24): disaggregating prefill and decode raises goodput per GPU (the highest request
  rate at which >= 90% of requests meet both a TTFT and a TPOT SLO) over a colocated vLLM-style
  engine. Setup here: OPT-13B on A100-80GB, chatbot-like lengths (log-normal, mean 750 in / 200
  out, clipped to 1536 / 512 for OPT's 2048-token context; our stand-in for ShareGPT), SLO TTFT <= 0.25 s and TPOT <= 0.1 s; 2 GPUs colocated (2
  replicas, vLLM-2023-style: no chunked prefill, a prompt runs whole) vs 1 prefill + 1 decode GPU.
  The chunked-prefill colocated engine (ours by default) is shown too. `distserve-tp`: DistServe's
  placement search in small (a TP degree per phase, the P:D count), against colocated with its TP searched.
- Splitwise (ISCA'24): prefill on H100 and decode on cheaper A100 ("Splitwise-HA") serves the same
  load at lower cost than all-H100. Setup here: Llama-2-70B, TP8 machines (8 GPUs each),
  conversation-like lengths (mean 1020 in / 129 out), SLO TTFT p99 <= 2 s, TPOT p99 <= 100 ms;
  the planner's search (replicas, P:D ratio) finds each family's cheapest configuration.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tokenmill.bench.fmt import md_table
from tokenmill.bench.arrivals import arrival_offsets
from tokenmill.bench.workloads import PromptBuilder, make_workload
from tokenmill.sim.cluster import ClusterConfig, build_cluster
from tokenmill.sim.hardware import load_hardware
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.plan_cli import SimEvaluator, Structure
from tokenmill.sim.planner import cheapest_units, parse_slo
from tokenmill.sim.simulator import ClusterSimulator, SimRequest
from tokenmill.sim.workload import TokenCounter, to_sim_requests

OPT_13B = {"hidden_size": 5120, "ffn_dim": 20480, "num_attention_heads": 40, "num_hidden_layers": 40,
           "vocab_size": 50272, "tie_word_embeddings": True}
LLAMA2_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
              "num_hidden_layers": 80, "vocab_size": 32000}


def requests(n: int, rate: float, input_len: int, output_len: int, seed: int = 0, max_input_len: int = 4096,
             max_output_len: int = 1024) -> list[SimRequest]:
    import numpy as np

    reqs = make_workload("chat", n, seed, PromptBuilder(None),
                         {"input_len": str(input_len), "output_len": str(output_len),
                          "max_input_len": str(max_input_len), "max_output_len": str(max_output_len)})
    offsets = arrival_offsets(len(reqs), rate, 1.0, np.random.default_rng([seed, 1]))
    return to_sim_requests(reqs, offsets, TokenCounter())


def attainment(sim: ClusterSimulator, reqs: list[SimRequest], ttft_s: float, tpot_s: float) -> float:
    res = sim.run(reqs)
    ok = sum(r.ttft <= ttft_s and (r.output_len < 2 or (r.e2e - r.ttft) / (r.output_len - 1) <= tpot_s)
             for r in res)
    return ok / len(res)


def max_rate(build, n: int, lengths: tuple[int, ...], slo: tuple[float, float], lo: float = 0.1,
             hi: float = 64.0, target: float = 0.9) -> float:
    """The highest Poisson rate (bisection, 1% precision) with SLO attainment >= target."""
    def ok(rate: float) -> bool:
        specs, link = build()
        return attainment(ClusterSimulator(specs, "least-loaded", transfer=link),
                          requests(n, rate, *lengths), *slo) >= target
    if not ok(lo):
        return 0.0
    while ok(hi):
        lo, hi = hi, 2 * hi
    while hi / lo > 1.01:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def distserve(n: int, tpot_slos: tuple[float, ...] = (0.1, 0.04)) -> dict[str, Any]:
    shape, hw = ModelShape.from_hf_config(OPT_13B, "OPT-13B"), load_hardware()
    lengths = (750, 200, 0, 1536, 512)  # OPT's context is 2048 tokens
    common = {"max_num_batched_tokens": 2048, "max_model_len": 2048}
    setups = {
        "colocated, whole prefills (vLLM-2023-like), 2 GPUs": ClusterConfig(replicas=2, **common),
        "colocated, chunked prefill 512, 2 GPUs": ClusterConfig(replicas=2, max_num_batched_tokens=512,
                                                                max_model_len=2048),
        "disaggregated 1 prefill + 1 decode GPU": ClusterConfig(prefill_replicas=1, decode_replicas=1,
                                                                link_gbps=25.0, **common),
        "disaggregated 2 prefill + 1 decode GPU": ClusterConfig(prefill_replicas=2, decode_replicas=1,
                                                                link_gbps=25.0, **common),
    }
    rows = {}
    for tpot in tpot_slos:
        slo = (0.25, tpot)
        base = None
        for name, cfg in setups.items():
            rate = max_rate(lambda cfg=cfg: build_cluster(cfg, shape, hw, "a100"), n, lengths, slo)
            per_gpu = rate / cfg.num_devices
            base = per_gpu if base is None else base
            rows[f"{name}, TPOT <= {1000 * tpot:g} ms"] = {
                "max_rate": rate, "goodput_per_gpu": per_gpu, "gain": per_gpu / base if base else None}
    return rows


def distserve_parallelism(n: int, tpot_slos: tuple[float, ...] = (0.1, 0.04)) -> dict[str, Any]:
    """DistServe's placement search, in small: each phase gets its own TP degree and instance count
    (prefill TP x decode TP in {1, 2}, P:D in 1:1, 2:1, 1:2), the colocated engine its TP (1, 2);
    the best goodput per GPU of each family."""
    shape, hw = ModelShape.from_hf_config(OPT_13B, "OPT-13B"), load_hardware()
    lengths = (750, 200, 0, 1536, 512)
    common = {"max_num_batched_tokens": 2048, "max_model_len": 2048}
    families = {
        "colocated, whole prefills, TP searched": [ClusterConfig(replicas=2 // tp, tp=tp, **common) for tp in (1, 2)],
        "disaggregated, one TP for both phases": [
            ClusterConfig(prefill_replicas=p, decode_replicas=d, tp=tp, link_gbps=25.0, **common)
            for tp in (1, 2) for p, d in ((1, 1), (2, 1), (1, 2))],
        "disaggregated, TP per phase": [
            ClusterConfig(prefill_replicas=p, decode_replicas=d, tp=tp_p, decode_tp=tp_d, link_gbps=25.0, **common)
            for tp_p in (1, 2) for tp_d in (1, 2) for p, d in ((1, 1), (2, 1), (1, 2))],
    }
    rows = {}
    for tpot in tpot_slos:
        slo, base = (0.25, tpot), None
        for name, configs in families.items():
            best = max(((max_rate(lambda cfg=cfg: build_cluster(cfg, shape, hw, "a100"), n, lengths, slo) / cfg.num_devices,
                         cfg) for cfg in configs), key=lambda x: x[0])
            base = best[0] if base is None else base
            rows[f"{name}, TPOT <= {1000 * tpot:g} ms"] = {
                "best": best[1].label().split(" batch")[0], "goodput_per_gpu": best[0],
                "gain": best[0] / base if base else None}
    return rows


def splitwise(n: int, rate: float) -> dict[str, Any]:
    shape, hw = ModelShape.from_hf_config(LLAMA2_70B, "Llama-2-70B"), load_hardware()
    slo = parse_slo("ttft_p99<=2s,tpot_p99<=100ms")
    reqs = requests(n, rate, 1020, 129)
    ev = SimEvaluator(shape, hw, reqs, slo, sum(r.output_len for r in reqs), sum(len(r.prompt_token_ids) for r in reqs))
    base = ClusterConfig(tp=8, max_num_batched_tokens=4096, max_num_seqs=256)
    families = {"all H100, colocated": [Structure("h100", None, base, None)],
                "all A100, colocated": [Structure("a100", None, base, None)]}
    for name, pre, dec in (("Splitwise-HH (H100 prefill, H100 decode)", "h100", None),
                           ("Splitwise-HA (H100 prefill, A100 decode)", "h100", "a100"),
                           ("Splitwise-AA (A100 prefill, A100 decode)", "a100", None)):
        families[name] = [Structure(pre, dec, ClusterConfig(tp=8, max_num_batched_tokens=4096, max_num_seqs=256,
                                                            prefill_replicas=p, decode_replicas=d, link_gbps=50.0,
                                                            decode_hardware=dec), (p, d))
                          for p, d in ((1, 1), (1, 2), (2, 1), (2, 3), (3, 2))]
    rows = {}
    for name, structs in families.items():
        found = [e for s in structs for e in [cheapest_units(s, ev, 16)[0]] if e is not None]
        if not found:
            rows[name] = {"config": "none meets the SLO"}
            continue
        e = min(found, key=lambda e: e.price_per_hour)
        rows[name] = {"config": e.structure.label(e.units), "price_per_hour": e.price_per_hour,
                      "usd_per_m_tokens": e.metrics["dollars"] / (ev.in_tokens + ev.out_tokens) * 1e6,
                      "ttft_p99_ms": e.metrics["ttft_ms.p99"], "tpot_p99_ms": e.metrics["tpot_ms.p99"]}
    base_price = rows["all H100, colocated"].get("price_per_hour")
    for r in rows.values():
        if "price_per_hour" in r and base_price:
            r["cost_vs_all_h100"] = r["price_per_hour"] / base_price
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenmill.sim.reproduce")
    p.add_argument("paper", choices=("distserve", "distserve-tp", "splitwise"))
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument("--rate", type=float, default=20.0, help="splitwise: the load served (req/s)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.paper == "splitwise":
        rows = splitwise(args.num_requests, args.rate)
    else:
        rows = (distserve if args.paper == "distserve" else distserve_parallelism)(args.num_requests)
    keys = sorted({k for r in rows.values() for k in r})
    table = md_table(["Setup", *keys], [[name, *[r.get(k) for k in keys]] for name, r in rows.items()])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.paper}.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    (Path(args.out) / f"{args.paper}.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
