"""Scratch: is our first W1 round slow because the offline KV cache is mapped as it fills?
W1-48 twice in one process, KV prefaulted at start or not (argv[1] = 0/1)."""
import sys, time, json
from tokenmill import LLM, SamplingParams
from tokenmill.bench.offline import make_w1, run_tokenmill
pf = sys.argv[1] == "1"
t0 = time.perf_counter()
llm = LLM(None, dtype="float32", quantization="none", max_num_seqs=128, max_num_batched_tokens=1024, kv_cache_prefault=pf)
start = time.perf_counter() - t0
wl = make_w1(48, llm.llm_engine.vocab_size, 0)
llm.generate([{"prompt_token_ids": p} for p in wl.prompts[:4]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
rounds = [run_tokenmill(llm, wl).summary()["output_tokens_per_s"] for _ in range(2)]
print(json.dumps({"prefault": pf, "start_s": round(start, 1), "rounds": [round(r, 1) for r in rounds]}))
