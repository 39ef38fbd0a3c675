"""What batch-invariant mode (`--batch-invariant`) costs: one engine per dtype, the mode switched
on and off between rounds in the same process (it is a process-wide kernel setting), rounds
alternated, best of --rounds. Workloads, greedy, ignore_eos:

- `decode1`: one request at a time (4 of them), 64-token prompts, 128 output tokens — TPOT;
- `batch32`: 32 W1-style random prompts (U[64,512]) submitted at once, 64 output tokens — tok/s;
- `prefill`: 8 prompts of 512 tokens, 1 output token — prompt tok/s.

    python -m tokenmill.bench.batch_invariance [--dtypes bfloat16,float32] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import random
import time

from tokenmill.bench.script import run_script, write_record


def _workloads(vocab: int) -> dict[str, tuple[list[list[int]], int, int]]:
    """name -> (prompts, max_tokens, requests submitted at once)."""
    from tokenmill.bench.offline import make_w1
    rng = random.Random(7)
    decode = [[rng.randrange(100, vocab) for _ in range(64)] for _ in range(4)]
    prefill = [[rng.randrange(100, vocab) for _ in range(512)] for _ in range(8)]
    return {"decode1": (decode, 128, 1), "batch32": (make_w1(32, vocab, seed=3).prompts, 64, 32),
            "prefill": (prefill, 1, 8)}


def _run(llm, prompts: list[list[int]], max_tokens: int, at_once: int) -> dict:
    from tokenmill import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.reset_prefix_cache()  # every round computes its prompts
    start, tpots = time.perf_counter(), []
    for i in range(0, len(prompts), at_once):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[i:i + at_once]], params, use_tqdm=False)
        tpots += [(o.metrics.last_token_time - o.metrics.first_token_time) / (max_tokens - 1)
                  for o in outs if max_tokens > 1]
    seconds = time.perf_counter() - start
    tokens = sum(len(p) for p in prompts) if max_tokens == 1 else max_tokens * len(prompts)
    return {"seconds": seconds, "tok_s": tokens / seconds, "tpot_ms": 1e3 * sum(tpots) / len(tpots) if tpots else None}


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine
    from tokenmill.kernels import cpu_ops
    results = []
    for dtype in args.dtypes.split(","):
        llm = LLM(args.model, dtype=dtype, quantization="none", max_num_seqs=32, kv_cache_memory_gb=1.0)
        workloads = _workloads(llm.get_tokenizer().vocab_size)
        for name, (prompts, max_tokens, at_once) in workloads.items():
            best: dict[str, dict] = {}
            for _ in range(args.rounds):
                for mode in ("default", "invariant"):
                    cpu_ops.set_batch_invariant(mode == "invariant")
                    res = _run(llm, prompts, max_tokens, at_once)
                    if mode not in best or res["tok_s"] > best[mode]["tok_s"]:
                        best[mode] = res
            cpu_ops.set_batch_invariant(False)
            ratio = best["invariant"]["tok_s"] / best["default"]["tok_s"]
            results.append({"dtype": dtype, "workload": name, **best, "throughput_ratio": ratio})
            tpot = "".join(f"; TPOT {best[m]['tpot_ms']:.1f} ms ({m})" for m in best if best[m]["tpot_ms"])
            print(f"{dtype:9s} {name:8s}: {best['default']['tok_s']:8.1f} -> {best['invariant']['tok_s']:8.1f} tok/s "
                  f"({ratio:.2f}x){tpot}", flush=True)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; best of {args.rounds}")
    write_record(args.json, results=results)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
