"""W1 through one tree with two KV cache dtypes, alternated in fresh subprocesses (same prompts; dtype
auto, weights unquantized, budget 1024 and the KV cache mapped at start as benchmarks/compare_vllm.py
does, but max_num_seqs 256 where that script has 128, so a cache with room for more sequences can run
them). The KV budget is the default (10% of available memory), so a bf16 cache holds twice the
tokens of a float32 one. Prints output tok/s per round and KV dtype, the best of each, their ratio, and how
many requests' greedy outputs are identical.

    TOKENMILL_CPU_ISA=avx2 python docs/benchmarks/isa/session32/kv_dtype_ab.py --kv auto --kv bfloat16 \
        [--num-requests 200] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys
from tokenmill import LLM
from tokenmill.bench.offline import make_w1, run_tokenmill
kvd, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
llm = LLM(dtype="auto", quantization="none", kv_cache_dtype=kvd, max_num_seqs=256, max_num_batched_tokens=1024,
          kv_cache_prefault=True)
vocab = llm.llm_engine.config.model.arch.vocab_size
run_tokenmill(llm, make_w1(2, vocab, seed=1))  # warm-up
wl = make_w1(n, vocab, seed=0)
from tokenmill import SamplingParams
import time
params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in wl.output_lens]
t = time.perf_counter()
outs = llm.generate([{"prompt_token_ids": p} for p in wl.prompts], params, use_tqdm=False)
sec = time.perf_counter() - t
toks = sum(len(o.outputs[0].token_ids) for o in outs)
json.dump({"tok_s": toks / sec, "seconds": sec, "dtype": llm.llm_engine.config.model.dtype,
           "outputs": [o.outputs[0].token_ids for o in outs]}, open(out, "w"))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kv", action="append", required=True)
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    best, outputs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for kvd in a.kv if r % 2 == 0 else a.kv[::-1]:
                path = f"{tmp}/{kvd}.json"
                subprocess.run([sys.executable, "-c", CHILD, kvd, str(a.num_requests), path], check=True,
                               stdout=subprocess.DEVNULL)
                got = json.load(open(path))
                print(f"round {r + 1} kv {kvd} (model dtype {got['dtype']}): {got['tok_s']:.1f} out tok/s", flush=True)
                best[kvd] = max(best.get(kvd, 0.0), got["tok_s"])
                outputs[kvd] = got["outputs"]
    first, second = a.kv[0], a.kv[1]
    same = sum(x == y for x, y in zip(outputs[first], outputs[second]))
    print(f"best: {first} {best[first]:.1f}, {second} {best[second]:.1f}; {second}/{first} {best[second] / best[first]:.3f}x; "
          f"greedy identical {same}/{len(outputs[first])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
