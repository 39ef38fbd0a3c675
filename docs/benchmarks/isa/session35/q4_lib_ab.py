"""A/B of the block-quantized GEMV/GEMM (q4_linear, q8_linear) between two builds of the kernel library
(old and new .so), alternated in fresh subprocesses.

    python docs/benchmarks/isa/session35/q4_lib_ab.py --a OLD.so --b NEW.so [--isa avx2] [--rounds 4] [--rows 1,8]

Each process packs the default model's four Q4 layer shapes 30 times over (distinct weights, 70 MB,
as a step reads them) and its tied 8-bit head ([49152, 576], 34 MB), then times a whole step's worth
of calls at --rows activation rows (1 and 8: decode batches; 512: a prompt chunk), median of 15 steps
(3 from 9 rows on): the q4 layers, then the head.
TOKENMILL_CPU_ISA caps the path (read when a library loads). Prints ms a step and the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time, torch
torch.ops.load_library(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
g = torch.Generator().manual_seed(0)
def q4(n, k):
    d = torch.rand(n, k // 32, generator=g) * 0.1
    return torch.ops.tokenmill.pack_q4(torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8), d, -8 * d)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = [[q4(n, k) for n, k in shapes] for _ in range(30)]
head = torch.ops.tokenmill.pack_q8(torch.randint(-127, 128, (49152, 576), generator=g, dtype=torch.int8),
                                   torch.rand(49152, 18, generator=g) * 0.01)
res = {}
for m in json.loads(sys.argv[3]):
    xs = [torch.randn(m, k, generator=g) for n, k in shapes]
    xh = torch.randn(m, 576, generator=g)
    body, top = [], []
    for _ in range(16 if m <= 8 else 4):
        t = time.perf_counter()
        for layer in layers:
            for (n, k), w, x in zip(shapes, layer, xs):
                torch.ops.tokenmill.q4_linear(x, w, n, None)
        t1 = time.perf_counter()
        torch.ops.tokenmill.q8_linear(xh, head, 49152, None)
        t2 = time.perf_counter()
        body.append(t1 - t); top.append(t2 - t1)
    res[m] = [statistics.median(body[1:]), statistics.median(top[1:])]
print(json.dumps({"isa": torch.ops.tokenmill.cpu_isa(), "res": res}))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--isa", default="auto")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default="1,8", help="activation rows per call, comma-separated")
    args = p.parse_args()
    env = {**os.environ, "TOKENMILL_CPU_ISA": args.isa}
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
            out = subprocess.run([sys.executable, "-c", CHILD, getattr(args, name), str(args.threads),
                              json.dumps([int(x) for x in args.rows.split(",")])], env=env,
                                 capture_output=True, text=True, check=True).stdout
            rec = json.loads(out.strip().splitlines()[-1])
            runs[name].append(rec["res"])
            print(f"round {r + 1} {name} ({rec['isa']}): " + ", ".join(
                f"M={m}: layers {v[0] * 1e3:.2f} ms, head {v[1] * 1e3:.2f} ms" for m, v in rec["res"].items()), flush=True)
    for m in runs["a"][0]:
        for i, part in enumerate(("q4 layers", "8-bit head")):
            best = {k: min(run[m][i] for run in v) for k, v in runs.items()}
            med = {k: statistics.median(run[m][i] for run in v) for k, v in runs.items()}
            print(f"M={m} {part}: best a {best['a'] * 1e3:.2f} / b {best['b'] * 1e3:.2f} ms (a / b {best['a'] / best['b']:.3f}x);"
                  f" median of rounds a {med['a'] * 1e3:.2f} / b {med['b'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
