"""Ray-launched vs process-launched 1 prefill + 1 decode: the same engines, router and workload.

    flock /tmp/tokenmill-bench.lock python -m tokenmill.bench.ray_launch --out out/ray_launch

Setups (both: the default model, --kv-connector nixl, `tokenmill router` in its own process):
  process  `tokenmill cluster`'s ProcessLauncher: prefill pinned to core 0, decode to core 1
  ray      a local Ray cluster of two logical nodes (1 CPU each, custom resources node_a / node_b,
           127.0.0.1), `tokenmill cluster --launcher ray`'s RayLauncher: prefill on node_a, decode
           on node_b (Ray reserves logical CPUs; it does not pin threads to cores)
--setups picks them and their order. Per setup: seconds from the first start call to both engines healthy, then bench.disagg's
long-short-mix workload through the router (a warm-up of 6 requests, then --num-requests at
--rate). Writes results.json and report.md into --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tokenmill.bench.disagg import ENGINE_ARGS, Proc, delta, run_bench, scrape
from tokenmill.disagg.launchers import ProcessLauncher, RayLauncher

ENGINE = [a for a in ENGINE_ARGS if a not in ("--num-threads", "1")] + ["--kv-connector", "nixl"]


def run_setup(name: str, args, first_port: int) -> dict:
    log_dir = (args.out / name).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if name == "process":
        launcher = ProcessLauncher(log_dir, first_port)
    else:
        launcher = RayLauncher(log_dir, first_port, None, ["node_a", "node_b"], num_cpus=1)
    router = None
    try:
        p = launcher.start(0, [*ENGINE, "--role", "prefill"], [0])
        d = launcher.start(1, [*ENGINE, "--role", "decode"], [1])
        launcher.wait_ready()
        startup_s = time.monotonic() - t0
        router = Proc(["router", "--prefill", p, "--decode", d, "--min-remote-prefill-tokens",
                       str(args.min_remote_prefill_tokens)], log_dir / "router.log").wait()
        slo = (args.slo_ttft_ms, args.slo_tpot_ms)
        run_bench(router, "long-short-mix", float("inf"), 6, 99, slo, log_dir / "warmup")
        before = scrape(d)
        s = run_bench(router, "long-short-mix", args.rate, args.num_requests, 1, slo, log_dir / "run")
        time.sleep(1.0)
        after = scrape(d)
        n = delta(after, before, "tokenmill:kv_transfer_bytes_count")
        return {"setup": name, "startup_s": startup_s, "completed": s["completed"], "failed": s["failed"],
                "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
                "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p99_ms": s["tpot_ms"]["p99"],
                "throughput_rps": s["request_throughput"], "handed_over": n,
                "kv_ms_per_handover": 1000 * delta(after, before, "tokenmill:kv_transfer_seconds_sum") / n if n else None}
    finally:
        if router is not None:
            router.stop()
        launcher.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenmill.bench.ray_launch", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/ray_launch"))
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--num-requests", type=int, default=20)
    ap.add_argument("--min-remote-prefill-tokens", type=int, default=256)
    ap.add_argument("--slo-ttft-ms", type=int, default=2000)
    ap.add_argument("--slo-tpot-ms", type=int, default=100)
    ap.add_argument("--first-port", type=int, default=18710)
    ap.add_argument("--setups", default="process,ray", help="which, in this order (default: %(default)s)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, setup in enumerate(args.setups.split(",")):
        if setup == "process":
            rows.append(run_setup("process", args, args.first_port + 2 * i))
        else:
            from tokenmill.ray.local_cluster import local_ray_cluster
            with local_ray_cluster(["node_a", "node_b"]):
                rows.append(run_setup("ray", args, args.first_port + 2 * i))
    for r in rows:
        print(json.dumps(r), flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    f = lambda v, p=0: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = ["| launcher | start-up s | done/failed | TTFT p50 / p99 ms | TPOT p50 / p99 ms | req/s | handed over "
             "| KV ms per hand-over |\n|---|---|---|---|---|---|---|---|\n"]
    lines += [f"| {r['setup']} | {f(r['startup_s'], 1)} | {r['completed']}/{r['failed']} | {f(r['ttft_p50_ms'])} / "
              f"{f(r['ttft_p99_ms'])} | {f(r['tpot_p50_ms'], 1)} / {f(r['tpot_p99_ms'], 1)} | "
              f"{f(r['throughput_rps'], 2)} | {r['handed_over']:.0f} | {f(r['kv_ms_per_handover'], 1)} |\n" for r in rows]
    (args.out / "report.md").write_text("".join(lines))
    print("".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
