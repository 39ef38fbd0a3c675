"""A/B of one long conversation's decode speed through the engine (`LLM`, batch 1), two checkouts
alternated in fresh processes.

    git worktree add /tmp/base HEAD
    python docs/benchmarks/isa/session35/long_decode_ab.py --a /tmp/base --b . [--contexts 1000,4000,7900]
        [--quantization none|gguf] [--rounds 2]

Each round runs each tree in a fresh subprocess (PYTHONPATH = the tree): one LLM (dtype auto), a
warm-up, then for each context length one prompt of that many new random tokens and 128 greedy output
tokens (ignore_eos). Reports TPOT = (last token time - first token time) / 127 by tree and context,
best of the rounds, and the ratio; the greedy outputs of the two trees are compared.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys
import numpy as np
from tokenmill import LLM, SamplingParams
contexts, quant, out = [int(x) for x in sys.argv[1].split(",")], sys.argv[2], sys.argv[3]
kw = {} if quant == "gguf" else {"quantization": quant}
llm = LLM(dtype="auto", max_model_len=8192, **kw)
vocab = llm.get_tokenizer().vocab_size
rng = np.random.default_rng(0)
sp = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
def prompt(n):
    return {"prompt_token_ids": rng.integers(100, vocab - 100, n).tolist()}
llm.generate([prompt(200)], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
res = {}
for n in contexts:
    o = llm.generate([prompt(n)], sp, use_tqdm=False)[0]
    m = o.metrics
    res[n] = {"tpot": (m.last_token_time - m.first_token_time) / 127, "tokens": list(o.outputs[0].token_ids)}
json.dump(res, open(out, "w"))
"""


def run_tree(tree: Path, contexts: str, quant: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    subprocess.run([sys.executable, "-c", CHILD, contexts, quant, out], check=True, env=env, cwd=tree,
                   stderr=subprocess.DEVNULL)
    res = json.loads(Path(out).read_text())
    os.unlink(out)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=Path, required=True)
    p.add_argument("--b", type=Path, required=True)
    p.add_argument("--contexts", default="1000,4000,7900")
    p.add_argument("--quantization", default="none")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for name in ("a", "b") if r % 2 == 0 else ("b", "a"):
            res = run_tree(getattr(args, name), args.contexts, args.quantization)
            runs[name].append(res)
            print(f"round {r + 1} {name}: " + ", ".join(f"{n} tokens {v['tpot'] * 1e3:.2f} ms" for n, v in res.items()),
                  flush=True)
    for n in runs["a"][0]:
        best = {k: min(run[n]["tpot"] for run in v) for k, v in runs.items()}
        same = all(ra[n]["tokens"] == rb[n]["tokens"] for ra in runs["a"] for rb in runs["b"])
        print(f"context {n}: a {best['a'] * 1e3:.2f} ms, b {best['b'] * 1e3:.2f} ms a token; a / b {best['a'] / best['b']:.3f}x;"
              f" greedy outputs {'identical' if same else 'differ'}")


if __name__ == "__main__":
    main()
