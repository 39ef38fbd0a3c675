"""Per-step time outside the kernels: decode steps of B requests (no prefill), timed with and without
torch.profiler; the op table's self time vs the wall time of the same steps.
python docs/benchmarks/isa/session28/step_overhead.py [B] [CTX]   (B requests of CTX-token prompts)"""
import sys, time, torch
from tokenmill import LLM, SamplingParams
B = int(sys.argv[1]) if len(sys.argv) > 1 else 1
CTX = int(sys.argv[2]) if len(sys.argv) > 2 else 64
llm = LLM(None, dtype="auto", quantization="none", kv_cache_prefault=True)
eng = llm.llm_engine
PREFILL_STEPS = B * CTX // 1024 + 2  # steps until every prompt is in (1024-token budget), with slack

def start_requests(decode_steps: int) -> None:
    for _ in range(B):
        eng.add_request(None, {"prompt_token_ids": list(range(100, 100 + CTX))},
                        SamplingParams(max_tokens=decode_steps + PREFILL_STEPS + 8, temperature=0, ignore_eos=True))
    for _ in range(PREFILL_STEPS): eng.step()

def finish() -> None:
    while eng.has_unfinished_requests(): eng.step()

def steps(n):
    start_requests(n)
    t = time.perf_counter()
    for _ in range(n): eng.step()
    dt = (time.perf_counter() - t) / n
    finish()
    return dt
steps(16)
plain = min(steps(40) for _ in range(3))
start_requests(40)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    t = time.perf_counter()
    for _ in range(40): eng.step()
    wall = (time.perf_counter() - t) / 40
finish()
ops = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6 / 40
print(f"B={B}: decode step {plain*1e3:.2f} ms (no profiler); profiled {wall*1e3:.2f} ms, of which ops' self time {ops*1e3:.2f} ms, outside ops {(wall-ops)*1e3:.2f} ms")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
