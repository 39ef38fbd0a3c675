"""Prefix-caching benchmark, and how many sequences a fixed KV budget holds per KV dtype.

Workload: N requests (default 100) that share one 400-token prefix, each followed by 50 unique
tokens, 64 output tokens each (greedy, ignore_eos); token ids drawn with a fixed seed. All requests
arrive at once, at t0. The same workload runs twice in one process, prefix caching on and off (a
fresh engine each, after a short warm-up), reporting throughput and TTFT p50/p99 (TTFT =
first_token_time - arrival_time from RequestOutput.metrics).

Concurrency at a fixed KV budget (default 0.5 GiB) per kv_cache_dtype: the number of blocks the
budget holds, the sequences of this workload (prefix + suffix + output tokens) that fit at once
without sharing and with the prefix shared, and the peak number of running sequences the real
scheduler reaches in a dry run of the workload (no model: the same Scheduler and KVCacheManager,
with tokens appended by a stub), prefix caching off and on.

    python -m tokenmill.bench.prefix [--num-requests 100] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass

from tokenmill.bench.metrics import percentile
from tokenmill.bench.offline import Result
from tokenmill.bench.script import run_script


@dataclass
class Workload:
    prefix: list[int]
    suffixes: list[list[int]]
    output_len: int

    @property
    def prompts(self) -> list[list[int]]:
        return [self.prefix + s for s in self.suffixes]

    @property
    def tokens_per_seq(self) -> int:
        return len(self.prefix) + len(self.suffixes[0]) + self.output_len


def make_workload(num_requests: int, vocab_size: int, prefix_len: int = 400, suffix_len: int = 50,
                  output_len: int = 64, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prefix = [rng.randrange(100, vocab_size) for _ in range(prefix_len)]
    suffixes = [[rng.randrange(100, vocab_size) for _ in range(suffix_len)] for _ in range(num_requests)]
    return Workload(prefix, suffixes, output_len)


@dataclass
class RunResult(Result):
    """One run of the workload (throughput properties and summary() from the offline Result)."""
    prefix_caching: bool
    ttft_p50: float
    ttft_p99: float
    ttft_mean: float
    cached_prompt_tokens: int
    num_preemptions: int
    num_kv_blocks: int


def run_engine(wl: Workload, prefix_caching: bool, engine_kwargs: dict, log=print) -> RunResult:
    from tokenmill import LLM, SamplingParams
    llm = LLM(enable_prefix_caching=prefix_caching, **engine_kwargs)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=wl.output_len, temperature=0, ignore_eos=True)
    # warm-up on unrelated tokens (kernels, allocator), then forget it
    llm.generate([{"prompt_token_ids": [7] * 40}] * 2, SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    llm.reset_prefix_cache()
    engine.core.prefix_stats.queries = engine.core.prefix_stats.hits = 0
    preempt0 = engine.core.scheduler.num_preemptions
    t0 = time.monotonic()
    for i, prompt in enumerate(wl.prompts):
        engine.add_request(f"p{i}", {"prompt_token_ids": prompt}, params, arrival_time=t0)
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
    seconds = time.monotonic() - t0
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs.values()]
    produced = sum(len(o.outputs[0].token_ids) for o in outs.values())
    assert produced == wl.output_len * len(wl.suffixes), "wrong number of output tokens"
    r = RunResult(f"caching {'on' if prefix_caching else 'off'}", seconds, len(outs), sum(map(len, wl.prompts)),
                  produced, prefix_caching, percentile(ttfts, 50), percentile(ttfts, 99), sum(ttfts) / len(ttfts),
                  sum(o.num_cached_tokens for o in outs.values()), engine.core.scheduler.num_preemptions - preempt0,
                  engine.config.cache.num_blocks)
    log(f"prefix caching {'on' if prefix_caching else 'off'}: {seconds:.1f}s, {r.output_tokens_per_s:.1f} out tok/s, "
        f"TTFT p50 {r.ttft_p50:.2f}s p99 {r.ttft_p99:.2f}s, cached prompt tokens {r.cached_prompt_tokens}")
    return r


# -- concurrency at a fixed KV budget ---------------------------------------------------------------
@dataclass
class Capacity:
    kv_cache_dtype: str
    dtype: str
    bytes_per_token: float
    num_blocks: int
    seqs_fit_unshared: int
    seqs_fit_shared_prefix: int
    peak_running_caching_off: int
    peak_running_caching_on: int


def dry_run_peak_running(wl: Workload, num_blocks: int, block_size: int, prefix_caching: bool,
                         num_requests: int) -> int:
    """Run the workload through the real EngineCore (scheduler, KV manager, lifecycle) with a
    DryRunExecutor in place of the model; return the largest number of sequences running at once.
    The first request runs one step alone, so the shared prefix is in the cache (a block becomes
    findable once its KV is written) before the others arrive. The token budget per step is
    unlimited, so memory alone limits admission (with a finite budget, the admission rate does: with
    caching on, prefills are short and the running set settles where admissions per step equal
    completions)."""
    from tokenmill.core.dry_run import DryRunExecutor
    from tokenmill.core.engine_core import EngineCore
    from tokenmill.core.kv_cache_manager import KVCacheManager
    from tokenmill.core.scheduler import SchedulerConfig
    from tokenmill.request import Request
    from tokenmill.sampling_params import SamplingParams

    core = EngineCore(SchedulerConfig(max_num_batched_tokens=1 << 30, max_num_seqs=1 << 30, max_model_len=1 << 20),
                      KVCacheManager(num_blocks, block_size, prefix_caching), DryRunExecutor(token_id=1))
    params = SamplingParams(max_tokens=wl.output_len, ignore_eos=True)
    suffix_len = len(wl.suffixes[0])
    peak = 0
    for i in range(num_requests):
        suffix = [(i * 7919 + j) % 50_000 + 100 for j in range(suffix_len)]  # distinct per request
        core.add_request(Request(str(i), wl.prefix + suffix, params, None, 0.0, wl.output_len))
        if i == 0:
            core.step()
    while core.has_unfinished_requests():
        core.step()
        peak = max(peak, len(core.scheduler.running))
    return peak


def capacities(wl: Workload, model: str | None, dtype: str, budget_gb: float, block_size: int,
               kv_dtypes=("auto", "int8", "fp8"), include_bf16: bool = True) -> list[Capacity]:
    import torch

    from tokenmill.engine.resolve import resolve_model_folder
    from tokenmill.models.model_config import load_model_config

    from tokenmill.engine.resolve import TORCH_DTYPES, resolve_dtype
    from tokenmill.models.registry import get_model_class

    cfg = load_model_config(resolve_model_folder(model))
    cls = get_model_class(cfg.architecture)
    model_dtype = TORCH_DTYPES[resolve_dtype(dtype)]
    rows = [("auto", torch.bfloat16)] if include_bf16 and model_dtype != torch.bfloat16 else []
    rows += [(k, model_dtype) for k in kv_dtypes]
    budget = int(budget_gb * (1 << 30))
    per_seq = -(-wl.tokens_per_seq // block_size)
    shared = len(wl.prefix) // block_size  # full blocks of the prefix, shared by all
    # enough requests that the budget, not the workload, limits concurrency
    out = []
    for kvd, dt in rows:
        per_token = cls.kv_bytes_per_token(cfg, kvd, dt, block_size)
        blocks = int(budget // (per_token * block_size))
        fit_unshared = blocks // per_seq
        fit_shared = (blocks - shared) // (per_seq - shared)
        n = 3 * fit_shared + 16
        out.append(Capacity(
            kvd, str(dt).removeprefix("torch."), per_token, blocks, fit_unshared, fit_shared,
            dry_run_peak_running(wl, blocks, block_size, False, n),
            dry_run_peak_running(wl, blocks, block_size, True, n)))
    return out


# -- report -------------------------------------------------------------------------------------------
def markdown(runs: list[RunResult], caps: list[Capacity], wl: Workload, meta: dict) -> str:
    lines = []
    if runs:
        on = next(r for r in runs if r.prefix_caching)
        off = next(r for r in runs if not r.prefix_caching)
        lines += [(f"{on.num_requests} requests, one shared {len(wl.prefix)}-token prefix + {len(wl.suffixes[0])} "
                  f"unique tokens each, {wl.output_len} output tokens (greedy, ignore_eos), all arriving at t0; "
                  f"model dtype {meta['dtype']}, kv_cache_dtype {meta['kv_cache_dtype']}, "
                  f"{on.num_kv_blocks} KV blocks of {meta['block_size']}, "
                  f"max_num_batched_tokens {meta['max_num_batched_tokens']}, max_num_seqs {meta['max_num_seqs']}."), "",
                  ("| prefix caching | seconds | req/s | output tok/s | total tok/s | TTFT p50 (s) | TTFT p99 (s) | "
                  "cached prompt tokens | preemptions |"),
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (off, on):
            lines.append(f"| {'on' if r.prefix_caching else 'off'} | {r.seconds:.1f} | {r.requests_per_s:.2f} | "
                         f"{r.output_tokens_per_s:.1f} | {r.total_tokens_per_s:.1f} | {r.ttft_p50:.2f} | "
                         f"{r.ttft_p99:.2f} | {r.cached_prompt_tokens:,} / {r.prompt_tokens:,} | {r.num_preemptions} |")
        lines += ["", (f"With caching: TTFT p50 {off.ttft_p50 / on.ttft_p50:.2f}x lower, p99 "
                  f"{off.ttft_p99 / on.ttft_p99:.2f}x lower, output throughput "
                  f"{on.output_tokens_per_s / off.output_tokens_per_s:.2f}x higher."), ""]
    if caps:
        lines += [(f"Concurrency at a {meta['budget_gb']} GiB KV budget, sequences of {wl.tokens_per_seq} tokens "
                  f"({-(-wl.tokens_per_seq // meta['block_size'])} blocks of {meta['block_size']}; the prefix is "
                  f"{len(wl.prefix) // meta['block_size']} full blocks):"), "",
                  ("| kv_cache_dtype | model dtype | KV bytes/token | blocks | fit, no sharing | fit, prefix shared | "
                  "peak admitted (dry run), caching off | peak admitted (dry run), caching on |"),
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for c in caps:
            lines.append(f"| {c.kv_cache_dtype} | {c.dtype} | {c.bytes_per_token:,.0f} | {c.num_blocks:,} | "
                         f"{c.seqs_fit_unshared} | {c.seqs_fit_shared_prefix} | {c.peak_running_caching_off} | "
                         f"{c.peak_running_caching_on} |")
        lines.append("")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--prefix-len", type=int, default=400)
    p.add_argument("--suffix-len", type=int, default=50)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "fp8"],
                   help="KV dtype of the caching on/off runs")
    p.add_argument("--kv-cache-memory-gb", type=float, default=None,
                   help="KV budget of the on/off runs (default: room for every request without sharing)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--budget-gb", type=float, default=0.5, help="fixed KV budget of the concurrency table")
    p.add_argument("--skip-run", action="store_true", help="only the concurrency table (no model runs)")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--markdown", default=None, help="write the Markdown tables here")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("prefix", help="prefix caching on/off (TTFT, throughput) and KV capacity per dtype")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tokenmill.bench.offline import machine
    from tokenmill.engine.resolve import resolve_model_folder
    from tokenmill.models.model_config import load_model_config

    if args.num_requests < 1 or args.prefix_len < 0 or args.suffix_len < 1 or args.output_len < 1:
        print("error: need --num-requests >= 1, --prefix-len >= 0, --suffix-len >= 1, --output-len >= 1",
              file=sys.stderr)
        return 2
    log = lambda s: print(s, file=sys.stderr, flush=True)
    cfg = load_model_config(resolve_model_folder(args.model))
    wl = make_workload(args.num_requests, cfg.vocab_size, args.prefix_len, args.suffix_len, args.output_len,
                       args.seed)
    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    runs = []
    if not args.skip_run:
        num_blocks = None
        if args.kv_cache_memory_gb is None:  # every request fits at once without sharing: no preemption
            num_blocks = args.num_requests * -(-wl.tokens_per_seq // args.block_size) + 64
        kwargs = {"model": args.model, "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype,
                      "kv_cache_memory_gb": args.kv_cache_memory_gb, "num_kv_blocks": num_blocks,
                      "block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
                      "max_num_batched_tokens": args.max_num_batched_tokens, "seed": args.seed}
        for caching in (True, False):
            runs.append(run_engine(wl, caching, kwargs, log))
    caps = capacities(wl, args.model, args.dtype, args.budget_gb, args.block_size)
    meta = {"dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype, "block_size": args.block_size,
            "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
            "budget_gb": args.budget_gb}
    cmd = "python -m tokenmill.bench.prefix " + " ".join(sys.argv[1:])
    text = (markdown(runs, caps, wl, meta) + f"\nCommand: `{cmd.strip()}`; machine: {machine()}; "
            f"date: {time.strftime('%Y-%m-%d')}; took {time.perf_counter() - t_start:.0f} s; load average "
            f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (other processes share the cores).\n")
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv,
                       "runs": [r.summary() for r in runs], "capacity": [asdict(c) for c in caps]}, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
