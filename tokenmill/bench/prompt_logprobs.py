"""Cost of prompt logprobs: the shipped text (tokenmill/data/alice_ch1_2.txt) in windows, each a
prompt that prefills and samples one token, without and with `prompt_logprobs` (0 and K), in
alternating rounds. Reports wall seconds per pass and how much of it the executor took (forward,
LM head over the prompt rows, log-softmax, ranks, top-k); the rest is host work (scheduling,
building each entry once in the frontend).

    python -m tokenmill.bench.prompt_logprobs [--dtype auto] [--window 1024] [--k 5] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from tokenmill.bench.logprobs import _ForwardTimes
from tokenmill.bench.script import run_script, write_record


def timed_pass(llm, prompts: list[dict], params) -> tuple[float, float]:
    """(wall seconds, executor seconds) of one generate() over all prompts."""
    engine = llm.llm_engine
    times = _ForwardTimes()
    engine.stat_loggers.append(times)
    try:
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, times.seconds
    finally:
        engine.stat_loggers.remove(times)


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM, SamplingParams
    from tokenmill.bench.offline import machine
    from tokenmill.data import read_text
    from tokenmill.eval.perplexity import windows

    kwargs = {"quantization": args.quantization} if args.quantization else {}
    llm = LLM(args.model, dtype=args.dtype, enable_prefix_caching=False, **kwargs)
    ids = llm.get_tokenizer().encode(read_text(), add_special_tokens=False)
    ids = ids[:args.num_tokens] if args.num_tokens else ids
    prompts = [{"prompt_token_ids": w} for w in windows(ids, args.window)]
    variants = {"plain": SamplingParams(max_tokens=1, temperature=0),
                "prompt_logprobs=0": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
                f"prompt_logprobs={args.k}": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=args.k)}
    timed_pass(llm, prompts[:1], variants["prompt_logprobs=0"])  # warm-up
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, params in variants.items():
            results[name].append(timed_pass(llm, prompts, params))
    spec = llm.llm_engine.config.model
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; dtype {spec.dtype}; quantization "
          f"{spec.quantization}; {len(ids)} tokens in {len(prompts)} windows of {args.window}; medians of "
          f"{args.rounds} alternating rounds")
    rows = []
    base = statistics.median(w for w, _ in results["plain"])
    for name, runs in results.items():
        wall, fwd = statistics.median(w for w, _ in runs), statistics.median(f for _, f in runs)
        rows.append({"variant": name, "wall_s": wall, "executor_s": fwd, "host_s": wall - fwd,
                     "vs_plain": wall / base, "runs": runs})
        print(f"{name:>20}: {wall:7.2f} s (executor {fwd:6.2f} s, host {wall - fwd:5.2f} s), {wall / base:.2f}x plain")
    write_record(args.json, rows=rows)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, help="weight format (default: the engine's choice)")
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-tokens", type=int, default=0, help="the first N tokens of the text only (0: all)")
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
