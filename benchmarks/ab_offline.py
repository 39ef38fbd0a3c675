"""A/B: the offline W1 workload through two checkouts of tokenmill, alternated in one run.

For a change that must not alter behaviour or speed (a refactor): each round runs W1 once per tree,
each in a fresh subprocess importing that tree (PYTHONPATH), through the public API only (`LLM`,
`SamplingParams`), so any two versions compare. Reports each run, the best of each tree, the ratio
of output tokens/s (B/A), and whether the greedy outputs are token-identical.

    git worktree add /tmp/base HEAD~1
    python benchmarks/ab_offline.py --a /tmp/base --b . --num-requests 48 --rounds 2 --json out.json

`--dtype-b` gives B its own dtype, to compare two dtypes of one tree (`--a . --b . --dtype float32
--dtype-b bfloat16`); the outputs then differ and "identical" reads False. `--env-a` / `--env-b
KEY=VALUE` (repeatable) set environment variables for one side, to compare two settings of one tree
(`--a . --b . --env-a TOKENMILL_NATIVE_STACK=decode`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
from tokenmill import LLM, SamplingParams
from tokenmill.bench.offline import make_w1
n, dtype, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
quant = sys.argv[4] if sys.argv[4] != "default" else None
t0 = time.perf_counter()
llm = LLM(dtype=dtype, max_num_seqs=128, max_num_batched_tokens=1024, **({"quantization": quant} if quant else {}))
start_s = time.perf_counter() - t0
wl = make_w1(n, llm.get_tokenizer().vocab_size, 0)
params = [SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in wl.output_lens]
llm.generate([{"prompt_token_ids": p} for p in wl.prompts[:4]], SamplingParams(max_tokens=8, temperature=0),
             use_tqdm=False)
llm.reset_prefix_cache()
t0 = time.perf_counter()
outs = llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params, use_tqdm=False)
seconds = time.perf_counter() - t0
tokens = [o.outputs[0].token_ids for o in outs]
json.dump({"seconds": seconds, "start_s": start_s, "output_tokens": sum(map(len, tokens)), "tokens": tokens},
          open(out, "w"))
"""


def run_tree(tree: Path, n: int, dtype: str, quantization: str, extra_env: list[str] = ()) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    env.update(kv.split("=", 1) for kv in extra_env)
    subprocess.run([sys.executable, "-c", CHILD, str(n), dtype, out, quantization], check=True, env=env, cwd=tree)
    res = json.loads(Path(out).read_text())
    os.unlink(out)
    res["digest"] = hashlib.sha256(json.dumps(res.pop("tokens")).encode()).hexdigest()[:16]
    res["output_tok_s"] = res["output_tokens"] / res["seconds"]
    res["load_before"] = os.getloadavg()[0]
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="checkout A (the baseline)")
    p.add_argument("--b", required=True, help="checkout B (the change)")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dtype-b", default=None, help="B's dtype (default: --dtype)")
    p.add_argument("--quantization", default="default",
                   help="weight format for both trees (default: the model's own: gguf for the default model)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE", help="environment for A's runs")
    p.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE", help="environment for B's runs")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    for kv in args.env_a + args.env_b:
        if "=" not in kv:
            p.error(f"--env-a/--env-b take KEY=VALUE, got {kv!r}")
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    dtypes = {"a": args.dtype, "b": args.dtype_b or args.dtype}
    for r in range(args.rounds):
        for name in ("a", "b"):
            res = run_tree(Path(getattr(args, name)), args.num_requests, dtypes[name], args.quantization,
                           getattr(args, f"env_{name}"))
            runs[name].append(res)
            print(f"round {r + 1} {name} ({dtypes[name]}): {res['seconds']:.1f} s, {res['output_tok_s']:.1f} out tok/s, "
                  f"outputs {res['digest']}", flush=True)
    best = {k: max(v, key=lambda x: x["output_tok_s"]) for k, v in runs.items()}
    identical = len({x["digest"] for v in runs.values() for x in v}) == 1
    ratio = best["b"]["output_tok_s"] / best["a"]["output_tok_s"]
    print(f"best: A {best['a']['output_tok_s']:.1f}, B {best['b']['output_tok_s']:.1f} out tok/s; B/A = {ratio:.3f}; "
          f"greedy outputs identical across every run: {identical}")
    if args.json:
        from tokenmill.bench.offline import machine
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv,
                       "runs": runs, "ratio_b_over_a": ratio, "identical": identical}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
