"""Where the engine's time goes on the W1 workload: torch.profiler's operator table (self CPU time),
after a two-request warm-up, with the engine's thread count fixed.

    python -m tokenmill.bench.profile [--dtype auto] [--quantization none] [--num-requests 24] [--threads 1] [--rows 14]
        [--prefault-kv]
"""
from __future__ import annotations

import argparse
import sys

from tokenmill.bench.script import run_script


def run(args: argparse.Namespace) -> int:
    from torch.profiler import ProfilerActivity, profile

    from tokenmill import LLM
    from tokenmill.bench.offline import machine, make_w1, run_tokenmill
    llm = LLM(dtype=args.dtype, quantization=args.quantization, max_num_seqs=128, max_num_batched_tokens=1024, num_threads=args.threads)
    vocab = llm.llm_engine.config.model.arch.vocab_size
    run_tokenmill(llm, make_w1(2, vocab, seed=1))  # warm-up: kernels loaded
    if args.prefault_kv:  # what `tokenmill serve` does: every KV page mapped before the first request
        from tokenmill.host_memory import prefault
        done = prefault([t for layer in llm.llm_engine.runner.kv_caches for t in layer], threads=args.threads)
        print(f"KV cache mapped first: {done.mapped_bytes / 2**30:.2f} GiB in {done.seconds:.2f} s"
              if done.supported else "KV cache left lazy: this kernel has no MADV_POPULATE_WRITE")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = run_tokenmill(llm, make_w1(args.num_requests, vocab, seed=0))
    print(f"machine: {machine()}; dtype {llm.llm_engine.config.model.dtype}; "
          f"weights {llm.llm_engine.config.model.quantization}; threads {args.threads}; "
          f"{result.num_requests} W1 requests, {result.output_tokens} output tokens in {result.seconds:.1f} s "
          f"({result.output_tokens / result.seconds:.1f} tok/s)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, help="weight format (default: the model's own: gguf for the "
                   "default model; none = float weights in --dtype)")
    p.add_argument("--num-requests", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, default=14)
    p.add_argument("--prefault-kv", action="store_true", help="map the whole KV cache before profiling, as "
                   "`tokenmill serve` does (offline engines map it lazily: each block's first write pays page faults)")


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
