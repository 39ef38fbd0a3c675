"""Offline throughput benchmark (workload W1) with a Hugging Face transformers baseline in the same run.

W1: N requests (default 200), prompt lengths U[64,512], output lengths U[32,256], ignore_eos, fixed
seed, default model in bf16. Baseline: transformers `generate`, static batches of 32, left padding,
greedy; it must run every batch until its longest output, and only requested tokens are counted.

    python -m tokenmill.bench.offline [--num-requests 200] [--baseline transformers|none]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass

from tokenmill.bench.script import run_script


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]


@dataclass
class Result:
    name: str
    seconds: float
    num_requests: int
    prompt_tokens: int
    output_tokens: int

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.seconds

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    def summary(self) -> dict:
        return {**asdict(self), "requests_per_s": self.requests_per_s,
                "output_tokens_per_s": self.output_tokens_per_s, "total_tokens_per_s": self.total_tokens_per_s}


def make_w1(num_requests: int, vocab_size: int, seed: int = 0, prompt_range=(64, 512),
            output_range=(32, 256)) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab_size) for _ in range(rng.randint(*prompt_range))]
               for _ in range(num_requests)]
    return Workload(prompts, [rng.randint(*output_range) for _ in range(num_requests)])


def run_tokenmill(llm, wl: Workload) -> Result:
    from tokenmill import SamplingParams
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in wl.output_lens]
    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outs)
    assert produced == sum(wl.output_lens), "tokenmill produced a different number of tokens"
    return Result("tokenmill", seconds, len(outs), sum(map(len, wl.prompts)), produced)


def run_transformers(folder: str, wl: Workload, dtype, batch_size: int = 32) -> Result:
    import torch
    import transformers
    from tqdm import tqdm

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    start = time.perf_counter()
    for i in tqdm(range(0, len(wl.prompts), batch_size), desc="transformers"):
        batch = wl.prompts[i:i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        new = max(wl.output_lens[i:i + batch_size])
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=pad)
    seconds = time.perf_counter() - start
    return Result("transformers", seconds, len(wl.prompts), sum(map(len, wl.prompts)), sum(wl.output_lens))


def machine() -> str:
    """The CPU a figure came from: model, family/model, the ISA flags that matter, cores, Python."""
    from tokenmill.cpu import cpu_model, isa_flags
    return (f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, ISA {' '.join(isa_flags()) or 'baseline'}, "
            f"Python {platform.python_version()}")


def print_table(results: list[Result]) -> None:
    print(f"{'engine':<14}{'seconds':>9}{'req/s':>8}{'out tok/s':>11}{'total tok/s':>13}")
    for r in results:
        print(f"{r.name:<14}{r.seconds:>9.1f}{r.requests_per_s:>8.2f}{r.output_tokens_per_s:>11.1f}"
              f"{r.total_tokens_per_s:>13.1f}")
    if len(results) == 2:
        print(f"ratio output tok/s {results[0].name}/{results[1].name}: "
              f"{results[0].output_tokens_per_s / results[1].output_tokens_per_s:.2f}x")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantization", default=None, choices=["gguf", "none", "int8", "int4"],
                   help="weight format (default: the engine's: gguf for a .gguf model)")
    p.add_argument("--baseline", default="transformers", choices=["transformers", "none"])
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--json", default=None, help="write results here")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("offline", help="offline throughput (W1) vs a transformers baseline")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    if args.num_requests < 1:
        print("error: --num-requests must be >= 1", file=sys.stderr)
        return 2
    llm = LLM(args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, quantization=args.quantization)
    engine = llm.llm_engine
    wl = make_w1(args.num_requests, engine.vocab_size, args.seed)
    results = [run_tokenmill(llm, wl)]
    if args.baseline == "transformers":
        results.append(run_transformers(engine.config.model.path, wl, engine.runner.dtype))
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; model dtype {engine.config.model.dtype}, "
          f"quantization {engine.config.model.quantization}")
    print_table(results)
    moe = {"expert_load": engine.runner.expert_load.summary()} if engine.runner.moe_layers else {}
    if moe:
        worst = moe["expert_load"]["imbalance_max_over_mean_worst_layer"]
        print(f"expert load imbalance (max/mean tokens per expert), worst layer: {worst:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv,
                       "results": [r.summary() for r in results], **moe}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
