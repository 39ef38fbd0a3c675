"""A/B of decode step time (`tokenmill.bench.roofline.measure_decode`: B sequences of 256-token
contexts, engine.step() timed) between two checkouts, alternated in fresh processes.

    git worktree add /tmp/base HEAD
    python docs/benchmarks/isa/session35/decode_step_ab.py --a /tmp/base --b . [--quantization none|gguf]
        [--batches 1,8,32] [--rounds 2]

gguf (the default): the default model's own Q4_1 layers and 8-bit tied head. Prints ms a step by
tree and batch (best of three 32-step runs a round), best of the rounds, and the ratio a / b.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
from tokenmill import LLM
from tokenmill.bench.roofline import measure_decode
batches, quant = [int(x) for x in sys.argv[1].split(",")], sys.argv[2]
kw = {} if quant == "gguf" else {"quantization": quant}
llm = LLM(dtype="auto", max_num_batched_tokens=1024, enable_prefix_caching=False, **kw)
measure_decode(llm, batch=1, steps=4)
print(json.dumps({b: min(measure_decode(llm, batch=b, steps=32)["step_s"] for _ in range(3)) for b in batches}))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--quantization", default="gguf")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
            tree = os.path.abspath(getattr(args, name))
            out = subprocess.run([sys.executable, "-c", CHILD, args.batches, args.quantization], cwd=tree,
                                 env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True,
                                 check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            runs[name].append(res)
            print(f"round {r + 1} {name}: " + ", ".join(f"B={b} {t * 1e3:.2f} ms" for b, t in res.items()), flush=True)
    for b in runs["a"][0]:
        best = {k: min(run[b] for run in v) for k, v in runs.items()}
        print(f"B={b}: a {best['a'] * 1e3:.2f} ms, b {best['b'] * 1e3:.2f} ms a step; a / b {best['a'] / best['b']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
