"""Where does our first W1 round lose time? Same workload twice in one process (prefix cache reset),
per-step core timings recorded; steps are deterministic so round 0 and 1 compare step by step."""
import sys, time, json, resource, os
from tokenmill.malloc import reexec_with_tcmalloc
reexec_with_tcmalloc("bench")
from tokenmill import LLM, SamplingParams
from tokenmill.bench.offline import make_w1
n = int(sys.argv[1]); out = sys.argv[2]
llm = LLM(None, dtype="auto", quantization="none", max_num_seqs=128, max_num_batched_tokens=1024)
eng = llm.llm_engine
wl = make_w1(n, eng.vocab_size, 0)
llm.generate([{"prompt_token_ids": p} for p in wl.prompts[:4]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
steps = []
orig = eng.core.step
def timed():
    t = time.perf_counter(); r = orig(); it = r.iteration
    steps.append((it.num_seqs, it.num_batched_tokens, it.num_prompt_tokens, it.schedule_time, it.forward_time, it.step_time, time.perf_counter() - t))
    return r
eng.core.step = timed
rounds = []
for rnd in range(int(sys.argv[3]) if len(sys.argv) > 3 else 2):
    llm.reset_prefix_cache(); steps.clear()
    params = [SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in wl.output_lens]
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params, use_tqdm=False)
    wall = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
    rounds.append({"wall": wall, "tok_s": sum(wl.output_lens) / wall, "utime": r1.ru_utime - r0.ru_utime, "stime": r1.ru_stime - r0.ru_stime,
                   "minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt, "nvcsw": r1.ru_nvcsw - r0.ru_nvcsw, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
                   "steps": list(steps)})
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in rounds[-1].items() if k != "steps"}), len(steps), flush=True)
json.dump(rounds, open(out, "w"))
