"""Where W1's wall time goes outside the model: schedule / forward / after-forward per step, summed
over one W1 run (no profiler), and forward time by batch shape.
SEQS=128 BUDGET=1024 python docs/benchmarks/isa/session28/step_split.py [N]   (max_num_seqs, max_num_batched_tokens)"""
import os, sys, time
from tokenmill import LLM
from tokenmill.bench.offline import make_w1, run_tokenmill

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
llm = LLM(None, dtype="auto", quantization="none", max_num_seqs=int(os.environ.get("SEQS", 128)), max_num_batched_tokens=int(os.environ.get("BUDGET", 1024)),
          kv_cache_prefault=True)
core = llm.llm_engine.core
steps = []  # (seqs, batched tokens, prompt tokens, schedule s, forward s, step s) per non-idle step
orig = core.step
def step():
    out = orig()
    it = out.iteration
    if it.step_time:
        steps.append((it.num_seqs, it.num_batched_tokens, it.num_prompt_tokens, it.schedule_time, it.forward_time,
                      it.step_time))
    return out
core.step = step
run_tokenmill(llm, make_w1(2, llm.llm_engine.vocab_size, 1))  # warm-up
steps.clear()
wl = make_w1(n, llm.llm_engine.vocab_size, 0)
t = time.perf_counter(); r = run_tokenmill(llm, wl); wall = time.perf_counter() - t
schedule, forward, total = (sum(s[i] for s in steps) for i in (3, 4, 5))
print(f"W1-{n}: {r.output_tokens_per_s:.1f} tok/s, wall {wall:.2f} s, steps {len(steps)}")
print(f"  core.step total {total:.2f} s = schedule {schedule:.2f} + forward {forward:.2f} + after {total - schedule - forward:.2f}")
print(f"  outside core.step (LLM/engine loop, outputs) {wall - total:.2f} s")
buckets = {}
for seqs, toks, ptoks, _, f, _ in steps:
    key = ("prefill+decode" if ptoks else "decode only", min(seqs // 16 * 16, 128))
    b = buckets.setdefault(key, [0, 0.0, 0]); b[0] += 1; b[1] += f; b[2] += toks
for k in sorted(buckets):
    count, f, toks = buckets[k]
    print(f"  {k[0]:15s} seqs {k[1]:3d}-{k[1]+15:3d}: {count:4d} steps, {f:6.2f} s forward, {toks/count:6.0f} tokens/step, {f/count*1e3:6.1f} ms/step")
