"""Frontend cost per output token with logprobs, against the output length.

One request at a time (greedy, ignore_eos, `logprobs=K`), outputs built every step as a streaming
server does. The host overhead of a step (scheduling, detokenization, logprob entries,
RequestOutput) is the wall time of `LLMEngine.step()` minus the executor's time (forward and
sampling), which the engine reports to its stat loggers. Flat per-token cost from 100 to 1,000
output tokens means no work grows with the length.

    python -m tokenmill.bench.logprobs [--lengths 100,300,1000] [--logprobs 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys
import time

from tokenmill.bench.script import run_script, write_record


class _ForwardTimes:
    """A stat logger that adds up the executor's time of each step."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def record(self, sched, it, finished, prefix, evictions) -> None:
        self.seconds += it.forward_time


def overhead_us_per_token(engine, length: int, logprobs: int | None, prompt: list[int]) -> float:
    from tokenmill import SamplingParams
    times = _ForwardTimes()
    engine.stat_loggers.append(times)
    try:
        params = SamplingParams(max_tokens=length, temperature=0, ignore_eos=True, logprobs=logprobs)
        engine.add_request(None, {"prompt_token_ids": prompt}, params)
        wall = 0.0
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            wall += time.perf_counter() - t0
    finally:
        engine.stat_loggers.remove(times)
    return (wall - times.seconds) / length * 1e6


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine
    lengths = [int(x) for x in args.lengths.split(",")]
    llm = LLM(args.model, dtype=args.dtype, max_model_len=max(lengths) + 64)
    engine = llm.llm_engine
    engine.stream_outputs = True  # build outputs every step, as the server does
    prompt = llm.get_tokenizer().encode("Write a long story about a lighthouse keeper.")
    overhead_us_per_token(engine, 16, args.logprobs, prompt)  # warm-up
    rows = []
    for length in lengths:
        row = {"output_tokens": length}
        for label, k in (("no_logprobs", None), (f"logprobs_{args.logprobs}", args.logprobs)):
            row[label] = min(overhead_us_per_token(engine, length, k, prompt) for _ in range(args.repeats))
        rows.append(row)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; host overhead in µs per output token (step wall time - forward time) "
          f"(best of {args.repeats})")
    print(f"{'output tokens':>14}{'no logprobs':>14}{f'logprobs={args.logprobs}':>14}")
    for row in rows:
        print(f"{row['output_tokens']:>14}{row['no_logprobs']:>14.1f}{row[f'logprobs_{args.logprobs}']:>14.1f}")
    last, first = rows[-1][f"logprobs_{args.logprobs}"], rows[0][f"logprobs_{args.logprobs}"]
    print(f"logprobs cost per token at {rows[-1]['output_tokens']} vs {rows[0]['output_tokens']} tokens: "
          f"{last / first:.2f}x")
    write_record(args.json, rows=rows)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--lengths", default="100,300,1000")
    p.add_argument("--logprobs", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
