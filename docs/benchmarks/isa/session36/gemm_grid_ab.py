"""A/B of the GEMM kernels' split over the threads (csrc/gemm_split.h) between two checkouts,
alternated in fresh processes.

    git worktree add /tmp/base f03e736
    python docs/benchmarks/isa/session36/gemm_grid_ab.py --a /tmp/base --b . [--threads 2] [--rounds 2]

Each call is one prompt chunk (M rows) through one weight: the default model's layer shapes (on 2
threads their column units divide evenly, so the split should not change), and narrow weights whose
column units are fewer than the threads times the old grain (64 columns: one task before on any
thread count; the situation of the default model's 576-column layers on a server with 18 or more
threads). Prints ms a call by tree (best of 5 a round, best of the rounds) and the ratio a / b.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
from tokenmill.kernels import cpu_ops
from tokenmill.quant.blocks import pack, quantize_int4
assert cpu_ops.load()
torch.set_num_threads(int(sys.argv[1]))
ops = torch.ops.tokenmill
shapes = [(1024, 576, 576), (1024, 960, 576), (1024, 3072, 576), (1024, 576, 1536), (1024, 64, 576), (256, 32, 576)]
res = {}
for m, n, k in shapes:
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    f32, bf16, q4 = ops.pack_panels(w), ops.pack_bf16_panels(w.bfloat16()), pack(quantize_int4(w, 32))
    calls = {"f32": lambda: ops.panel_linear(x, f32, n, None), "bf16": lambda: ops.bf16_panel_linear(x, bf16, n, None),
             "q4": lambda: ops.q4_linear(x, q4, n, None)}
    for name, f in calls.items():
        f()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter(); f(); best = min(best, time.perf_counter() - t0)
        res[f"{name} M={m} N={n} K={k}"] = best
print(json.dumps(res))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
            tree = os.path.abspath(getattr(args, name))
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.threads)], cwd=tree,
                                 env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True,
                                 check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r + 1} {name} done", flush=True)
    for key in runs["a"][0]:
        a, b = (min(run[key] for run in runs[t]) for t in ("a", "b"))
        print(f"{key:28s} a {a * 1e3:8.3f} ms  b {b * 1e3:8.3f} ms  a / b {a / b:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
