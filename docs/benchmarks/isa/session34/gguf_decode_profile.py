"""Per-kernel time of a batch-1 decode step on the default model's GGUF weights: torch.profiler over a
68-step and a 4-step roofline.measure_decode run, the difference divided by 64 (prefill cancels out).
    python docs/benchmarks/isa/session34/gguf_decode_profile.py"""
import torch

from tokenmill import LLM
from tokenmill.bench.roofline import measure_decode

llm = LLM(max_num_batched_tokens=1024, enable_prefix_caching=False)
measure_decode(llm, batch=1, steps=4)
runs = []
for steps in (4, 68):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        measure_decode(llm, batch=1, steps=steps)
    runs.append({e.key: e.self_cpu_time_total for e in prof.key_averages()})
short, long = runs
for key in sorted(long, key=lambda k: -(long[k] - short.get(k, 0)))[:8]:
    print(f"{key}: {(long[key] - short.get(key, 0)) / 64 / 1e3:.3f} ms per decode step")
