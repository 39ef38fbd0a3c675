import sys, time, numpy as np
from torch.profiler import profile, ProfilerActivity
from tokenmill import LLM, SamplingParams
n = int(sys.argv[1])
llm = LLM(dtype="auto", quantization="none", max_num_batched_tokens=2048)
rng = np.random.default_rng(0)
sp = SamplingParams(max_tokens=1, ignore_eos=True)
llm.generate([{"prompt_token_ids": rng.integers(100, 40000, 300).tolist()}], sp, use_tqdm=False)
t=time.time()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(2):
        llm.generate([{"prompt_token_ids": rng.integers(100, 40000, n).tolist()}], sp, use_tqdm=False)
print("s/prompt", (time.time()-t)/2)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))
