"""How fast the simulator runs a large trace: `python -m tokenmill.sim.speed [--num-requests N]`
(a benchmark, not a test: run it under the bench lock on a shared machine)."""
from __future__ import annotations

import argparse
import os
import time

from tokenmill.cpu import cpu_model
from tokenmill.sim.cluster import ClusterConfig, build_cluster
from tokenmill.sim.hardware import load_hardware
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.reproduce import LLAMA2_70B, requests
from tokenmill.sim.simulator import ClusterSimulator


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenmill.sim.speed")
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--replicas", type=int, default=4)
    args = p.parse_args(argv)
    shape = ModelShape.from_hf_config(LLAMA2_70B, "Llama-2-70B")
    reqs = requests(args.num_requests, args.rate, 512, 128)
    specs, _ = build_cluster(ClusterConfig(replicas=args.replicas, tp=8, max_num_batched_tokens=4096,
                                           max_num_seqs=256), shape, load_hardware(), "h100")
    t0 = time.perf_counter()
    sim = ClusterSimulator(specs, "least-loaded")
    res = sim.run(reqs)
    wall = time.perf_counter() - t0
    steps = sum(r.executor.num_steps for r in sim.replicas)
    tokens = sum(len(r.token_times) for r in res)
    print(f"{len(res)} requests ({tokens} output tokens, {sum(len(r.prompt_token_ids) for r in reqs)} prompt "
          f"tokens), {args.replicas} replicas, {steps} engine steps, {sim.end_time:.0f} s simulated: "
          f"{wall:.1f} s wall ({steps / wall:.0f} steps/s) on {cpu_model()}, load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
