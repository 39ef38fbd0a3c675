"""Where W1's wall time goes outside the model: schedule / forward / after-forward per step, summed
over one W1 run (no profiler). python docs/benchmarks/isa/session28/step_split.py [N]"""
import os, sys, time, json
from tokenmill import LLM
from tokenmill.bench.offline import make_w1, run_tokenmill

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
llm = LLM(None, dtype="auto", quantization="none", max_num_seqs=int(os.environ.get("SEQS", 128)), max_num_batched_tokens=int(os.environ.get("BUDGET", 1024)),
          kv_cache_prefault=True)
core = llm.llm_engine.core
acc = {"schedule": 0.0, "forward": 0.0, "step": 0.0, "steps": 0}
orig = core.step
def step():
    out = orig()
    it = out.iteration
    if it.step_time:
        steps.append((it.num_seqs, it.num_batched_tokens, it.num_prompt_tokens, it.forward_time))
        acc["schedule"] += it.schedule_time; acc["forward"] += it.forward_time; acc["step"] += it.step_time; acc["steps"] += 1
    return out
core.step = step
steps = []
wl = make_w1(2, llm.llm_engine.vocab_size, 1); run_tokenmill(llm, wl)
wl = make_w1(n, llm.llm_engine.vocab_size, 0)
for k in acc: acc[k] = 0
steps.clear()
t = time.perf_counter(); r = run_tokenmill(llm, wl); wall = time.perf_counter() - t
print(f"W1-{n}: {r.output_tokens_per_s:.1f} tok/s, wall {wall:.2f} s, steps {acc['steps']}")
print(f"  core.step total {acc['step']:.2f} s = schedule {acc['schedule']:.2f} + forward {acc['forward']:.2f} + after {acc['step']-acc['schedule']-acc['forward']:.2f}")
print(f"  outside core.step (LLM/engine loop, outputs) {wall-acc['step']:.2f} s")
buckets = {}
for seqs, toks, ptoks, f in steps:
    key = ("prefill+decode" if ptoks else "decode only", min(seqs // 16 * 16, 128))
    b = buckets.setdefault(key, [0, 0.0, 0]); b[0] += 1; b[1] += f; b[2] += toks
for k in sorted(buckets):
    n, f, toks = buckets[k]
    print(f"  {k[0]:15s} seqs {k[1]:3d}-{k[1]+15:3d}: {n:4d} steps, {f:6.2f} s forward, {toks/n:6.0f} tokens/step, {f/n*1e3:6.1f} ms/step")
if os.environ.get("OUT"): json.dump(steps, open(os.environ["OUT"], "w"))
