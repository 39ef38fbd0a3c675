"""compare_vllm.py with per-step timings of our rounds, our rusage and the host's steal time per round."""
import sys, time, json, resource
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
from tokenmill.malloc import reexec_with_tcmalloc
reexec_with_tcmalloc("bench")
import compare_vllm as cv
from tokenmill.core.engine_core import EngineCore
STEPS, ROUNDS = [], []
orig_step = EngineCore.step
def step(self):
    t = time.perf_counter(); r = orig_step(self); it = r.iteration
    STEPS.append((it.num_seqs, it.num_batched_tokens, it.num_prompt_tokens, it.forward_time, time.perf_counter() - t))
    return r
EngineCore.step = step
def stat():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return {"user": v[0], "system": v[2], "idle": v[3], "iowait": v[4], "steal": v[7]}
orig_run = cv.run_ours
def run_ours(llm, wl, return_ids):
    STEPS.clear(); s0 = stat(); r0 = resource.getrusage(resource.RUSAGE_SELF)
    res = orig_run(llm, wl, return_ids)
    r1 = resource.getrusage(resource.RUSAGE_SELF); s1 = stat()
    ROUNDS.append({"tok_s": res[0].output_tokens_per_s, "utime": r1.ru_utime - r0.ru_utime, "stime": r1.ru_stime - r0.ru_stime,
                   "minflt": r1.ru_minflt - r0.ru_minflt, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
                   "host_ticks": {k: s1[k] - s0[k] for k in s0}, "steps": list(STEPS)})
    print("PROBE", json.dumps({k: v for k, v in ROUNDS[-1].items() if k != "steps"}), flush=True)
    json.dump(ROUNDS, open(sys.argv[-1], "w"))
    return res
cv.run_ours = run_ours
sys.exit(cv.main(sys.argv[1:-1]))
