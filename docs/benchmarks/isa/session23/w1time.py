import sys, time, collections
from tokenmill import LLM
from tokenmill.bench.offline import make_w1, run_tokenmill
from tokenmill.worker import model_runner as mr
from tokenmill.core import engine_core as ec
T = collections.Counter()
def wrap(cls, name, key):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[key] += time.perf_counter() - t; return r
    setattr(cls, name, g)
llm = LLM(dtype="auto", quantization="none", max_num_seqs=128, max_num_batched_tokens=1024, kv_cache_prefault=True)
m = llm.llm_engine.runner.model if hasattr(llm.llm_engine, "runner") else None
wrap(type(m), "forward", "model.forward")
wrap(type(m), "compute_logits", "compute_logits")
wrap(mr.ModelRunner, "_execute", "runner._execute")
wrap(mr.ModelRunner, "_layout", "runner._layout")
wrap(mr.ModelRunner, "_sample", "runner._sample")
wrap(ec.EngineCore, "step", "core.step")
from tokenmill.engine import engine as eng
wrap(eng.LLMEngine, "step", "engine.step")
vocab = llm.llm_engine.config.model.arch.vocab_size
run_tokenmill(llm, make_w1(2, vocab, seed=1))
T.clear()
n = int(sys.argv[1])
r = run_tokenmill(llm, make_w1(n, vocab, seed=0))
print(f"W1-{n}: {r.output_tokens / r.seconds:.1f} out tok/s in {r.seconds:.2f} s")
for k, v in T.most_common(): print(f"{k:20s} {v:7.2f} s")
