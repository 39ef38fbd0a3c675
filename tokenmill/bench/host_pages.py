"""What huge pages buy on this machine (tokenmill/host_memory.py), measured both ways in one process.

  read     a sum over 512 MiB: 4 KiB pages against huge pages (the read floor of a decode step)
  engine   one engine, its weights re-gathered into an arena with and without the huge-page advice
           before each round (models/weight_arena.py); greedy decode of `--tokens` tokens at each
           batch size; ms per step

Rounds alternate the two kinds; the best round of each is compared. The KV cache keeps the pages it
got at start in both (huge where the kernel allows), so the engine figures isolate the weights.

    python -m tokenmill.bench.host_pages [--dtype auto] [--quantization none] [--batch-sizes 1,16]
        [--tokens 200] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from tokenmill import host_memory
from tokenmill.bench.script import run_script, write_record

KINDS = ("4k", "huge")


def read_rates(rounds: int) -> dict[str, list[float]]:
    from tokenmill.bench.peaks import read_bandwidth
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            rates[kind].append(read_bandwidth(huge=kind == "huge"))
    return rates


def decode_steps(llm, batch: int, tokens: int, rounds: int) -> dict[str, list[float]]:
    from tokenmill import SamplingParams
    from tokenmill.models.weight_arena import gather_weights
    model = llm.llm_engine.runner.model
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [100 + i, 200 + i, 300 + i, 400 + i]} for i in range(batch)]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    steps: dict[str, list[float]] = {k: [] for k in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            gather_weights(model, huge=kind == "huge")
            t = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            steps[kind].append((time.perf_counter() - t) / tokens * 1e3)
    gather_weights(model)  # leave the engine as it was built
    return steps


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine
    res: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
                 "thp": host_memory.thp_mode(), "threads": torch.get_num_threads()}
    if not host_memory.huge_pages_wanted() or res["thp"] not in ("always", "madvise"):
        print(f"note: {host_memory.describe()}: both kinds get the same pages here", file=sys.stderr)
    res["read_gbps"] = read_rates(args.rounds)
    llm = LLM(dtype=args.dtype, quantization=args.quantization, enable_prefix_caching=False)
    res["dtype"] = str(llm.llm_engine.runner.dtype)
    res["decode_ms_per_step"] = {b: decode_steps(llm, b, args.tokens, args.rounds)
                                 for b in (int(x) for x in args.batch_sizes.split(","))}
    print(f"{res['machine']}; THP {res['thp']}; {res['dtype']}; best of {args.rounds}, alternated")
    r = res["read_gbps"]
    print(f"read 512 MiB: 4k {max(r['4k']):.1f} GB/s, huge {max(r['huge']):.1f} GB/s, "
          f"{max(r['huge']) / max(r['4k']):.2f}x")
    for b, steps in res["decode_ms_per_step"].items():
        print(f"decode batch {b}: 4k {min(steps['4k']):.2f} ms/step, huge {min(steps['huge']):.2f} ms/step, "
              f"{min(steps['4k']) / min(steps['huge']):.2f}x faster with huge pages")
    write_record(args.json, **{k: v for k, v in res.items() if k not in ("machine", "date")})
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, help="weight format (default: the model's own; none = float "
                   "weights in --dtype)")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
