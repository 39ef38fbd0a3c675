"""A/B of single-prompt prefill time through the engine (`LLM`, max_tokens 1), two checkouts alternated.

    git worktree add /tmp/base HEAD
    python docs/benchmarks/isa/session31/prefill_engine_ab.py --a /tmp/base --b . [--lengths 1024,2048,4000]

Each round runs each tree in a fresh subprocess (PYTHONPATH = the tree): one LLM (dtype auto, weights
unquantized, the serve default budget of 1,024 tokens a step, so a 4,000-token prompt runs as four
chunks over a growing cached context), one warm-up prompt, then --repeats prompts a length, each of
new random tokens (no prefix hits). Prints seconds per prompt (median, min) and the model GFLOP/s
(`tokenmill.bench.roofline.model_flops_per_token`: the layers' matmuls + causal attention) by tree
and length, then the ratio of the best medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
from tokenmill import LLM, SamplingParams
from tokenmill.bench.roofline import model_flops_per_token
lengths, repeats, out = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2]), sys.argv[3]
llm = LLM(dtype="auto", quantization="none", max_num_batched_tokens=1024)
vocab = llm.get_tokenizer().vocab_size
rng = np.random.default_rng(0)
one = SamplingParams(max_tokens=1, temperature=0)
def prompt(n):
    return {"prompt_token_ids": rng.integers(100, vocab - 100, n).tolist()}
llm.generate([prompt(256)], one, use_tqdm=False)
cfg = llm.llm_engine.config.model.arch
res = {"flop": {n: n * model_flops_per_token(cfg, n / 2) for n in lengths}}
for n in lengths:
    ts = []
    for _ in range(repeats):
        p = prompt(n)
        t = time.perf_counter()
        llm.generate([p], one, use_tqdm=False)
        ts.append(time.perf_counter() - t)
    res[n] = ts
json.dump(res, open(out, "w"))
"""

def run_tree(tree: Path, lengths: str, repeats: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    subprocess.run([sys.executable, "-c", CHILD, lengths, str(repeats), out], check=True, env=env, cwd=tree,
                   stderr=subprocess.DEVNULL)
    res = json.loads(Path(out).read_text())
    os.unlink(out)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--lengths", default="1024,2048,4000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    best: dict[str, dict[int, float]] = {"a": {}, "b": {}}
    for r in range(args.rounds):
        for name in ("a", "b"):
            res = run_tree(Path(getattr(args, name)), args.lengths, args.repeats)
            flop = {int(n): f for n, f in res.pop("flop").items()}
            for n, ts in ((int(n), ts) for n, ts in res.items()):
                med = statistics.median(ts)
                best[name][n] = min(best[name].get(n, 1e9), med)
                print(f"round {r + 1} {name} L={n}: median {med * 1e3:.0f} ms (min {min(ts) * 1e3:.0f}), "
                      f"{flop[n] / med / 1e9:.0f} GFLOP/s, load {os.getloadavg()[0]:.2f}", flush=True)
    for n in best["a"]:
        print(f"L={n}: best median A {best['a'][n] * 1e3:.0f} ms, B {best['b'][n] * 1e3:.0f} ms, "
              f"A/B {best['a'][n] / best['b'][n]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
