"""A/B (session 37): speculative verification chunks as decode rows (paged_decode, the rule since
session 37) vs the chunk path they took before (gather + prefill attention), outside batch-invariant
mode. One process, rounds alternated; greedy, ngram, 256 tokens after a repetitive prompt.

    python docs/benchmarks/isa/session37/spec_rows_ab.py CONTEXT [BATCH] [K]

The rule before session 37 is the current one with DECODE_ROWS_MAX = 1 (outside batch-invariant mode
only lone generated rows were decodes), so the script switches that constant between rounds.
"""
import sys
import time

import tokenmill.attention.cpu_paged as cpu_paged
from tokenmill import LLM, SamplingParams

RULES = {"orig": 1, "rows": cpu_paged.DECODE_ROWS_MAX}


def main() -> None:
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    llm = LLM(dtype="auto", quantization="none", max_model_len=8192,
              speculative_config={"method": "ngram", "num_speculative_tokens": k})
    base = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep one by one "
            "and the river flows gently past the old mill at the edge of the village. ")
    ids = llm.get_tokenizer().encode(base * 200)[:ctx]
    prompts = [{"prompt_token_ids": ids[i:]} for i in range(batch)]
    sp = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in RULES}
    outs = {}
    for _ in range(3):
        for name, rows_max in RULES.items():
            cpu_paged.DECODE_ROWS_MAX = rows_max
            t = time.perf_counter()
            o = llm.generate(prompts, sp, use_tqdm=False)
            times[name].append(time.perf_counter() - t)
            outs[name] = [x.outputs[0].token_ids for x in o]
    same = sum(a == b for a, b in zip(outs["orig"], outs["rows"]))
    print(f"ctx {ctx} batch {batch}: orig {[round(x, 2) for x in times['orig']]} "
          f"rows {[round(x, 2) for x in times['rows']]} best orig/rows {min(times['orig']) / min(times['rows']):.3f}x; "
          f"identical {same}/{batch}")


if __name__ == "__main__":
    main()
