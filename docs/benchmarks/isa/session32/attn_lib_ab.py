"""A/B of prefill_attention between two builds of the kernel library (old and new .so), alternated in
fresh subprocesses, each round timing every case (best of a few calls) in both libraries.

    python docs/benchmarks/isa/session32/attn_lib_ab.py --a OLD.so --b NEW.so [--isa avx2] [--rounds 4] [--threads 2]

A library is loaded with torch.ops.load_library (the two register the same op names, so one per process);
TOKENMILL_CPU_ISA caps the path (read when a library loads). Prints GF/s over the unmasked half of the
score matrix and the ratio of the best times, plus the largest difference of the outputs relative to
their largest value.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CASES = [(512, 0), (1024, 0), (2048, 0), (1024, 3072), (128, 1024)]
CHILD = r"""
import json, sys, time, torch
torch.ops.load_library(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
res = {}
for L, ctx in json.loads(sys.argv[3]):
    g = torch.Generator().manual_seed(L + ctx)
    q = torch.randn(L, 9, 64, generator=g); k = torch.randn(ctx + L, 3, 64, generator=g); v = torch.randn(ctx + L, 3, 64, generator=g)
    flop = 2 * 9 * 64 * L * (2 * ctx + L)
    out = torch.ops.tokenmill.prefill_attention(q, k, v, ctx, 0.125, False)
    best = 1e9
    for _ in range(max(3, int(3e9 / flop))):
        t = time.perf_counter(); torch.ops.tokenmill.prefill_attention(q, k, v, ctx, 0.125, False)
        best = min(best, time.perf_counter() - t)
    torch.save(out, f"{sys.argv[4]}_{L}_{ctx}.pt")
    res[f"{L},{ctx}"] = [best, flop]
print(json.dumps({"isa": torch.ops.tokenmill.cpu_isa(), "res": res}))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--isa", default="auto")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import torch
    env = {**os.environ, "TOKENMILL_CPU_ISA": args.isa}
    best: dict[str, dict[str, float]] = {"a": {}, "b": {}}
    flops: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
                out = subprocess.run([sys.executable, "-c", CHILD, getattr(args, name), str(args.threads),
                                      json.dumps(CASES), f"{tmp}/{name}"], env=env, capture_output=True, text=True,
                                     check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                for key, (sec, flop) in got["res"].items():
                    best[name][key] = min(best[name].get(key, 1e9), sec)
                    flops[key] = flop
                print(f"round {r + 1} {name}: {got['isa']}", flush=True)
        for L, ctx in CASES:
            key = f"{L},{ctx}"
            a, b = best["a"][key], best["b"][key]
            oa, ob = torch.load(f"{tmp}/a_{L}_{ctx}.pt"), torch.load(f"{tmp}/b_{L}_{ctx}.pt")
            rel = ((oa - ob).abs().max() / oa.abs().max()).item()
            print(f"L={L} ctx={ctx}: a {a * 1e3:.2f} ms ({flops[key] / a / 1e9:.0f} GF/s)  b {b * 1e3:.2f} ms "
                  f"({flops[key] / b / 1e9:.0f} GF/s)  {a / b:.2f}x  maxrel {rel:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
