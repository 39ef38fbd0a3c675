"""One prompt's prefill, alone, offline: wall time by prompt length and torch.profiler's table for one length.

    python docs/benchmarks/isa/session25/prefill_breakdown.py [--lengths 256,512,1024,1900] [--profile 512]

bf16 weights (quantization none), max_tokens 1, prefix caching off, 2 threads, KV prefaulted; each length:
1 warm-up then 5 timed runs with fresh random token ids. GFLOP/s counts the linear layers (2 * params * tokens,
LM head once) and causal attention (2 * 2 * layers * heads * head_dim * L^2 / 2).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tokenmill import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="256,512,1024,1900")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()
    llm = LLM(dtype="bfloat16", quantization="none", enable_prefix_caching=False, max_model_len=8192,
              kv_cache_prefault=True)
    rng = np.random.default_rng(0)
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    params_lin = 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536)
    for n in [int(x) for x in a.lengths.split(",")]:
        ts = []
        for i in range(6):
            ids = rng.integers(100, 40000, size=n).tolist()
            t0 = time.perf_counter()
            llm.generate({"prompt_token_ids": ids}, sp, use_tqdm=False)
            ts.append(time.perf_counter() - t0)
        t = statistics.median(ts[1:])
        flops = 2 * params_lin * n + 2 * 576 * 49152 + 4 * 30 * 9 * 64 * n * n / 2
        print(f"L={n}: median {t * 1e3:.1f} ms (min {min(ts[1:]) * 1e3:.1f}), {flops / t / 1e9:.0f} GFLOP/s", flush=True)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        ids = rng.integers(100, 40000, size=a.profile).tolist()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate({"prompt_token_ids": ids}, sp, use_tqdm=False)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
