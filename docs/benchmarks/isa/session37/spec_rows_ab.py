"""A/B (session 37): speculative verification chunks as decode rows (paged_decode, the rule since
session 37) vs the chunk path they took before (gather + prefill attention), outside batch-invariant
mode. One process, rounds alternated; greedy, ngram, 256 tokens after a repetitive prompt.

    python docs/benchmarks/isa/session37/spec_rows_ab.py CONTEXT [BATCH] [K]
"""
import sys, time
import tokenmill.attention.cpu_paged as cp
from tokenmill.attention.cpu_paged import CpuPagedMetadata, _build_decodes, _build_prefill, _prompt_rows
from tokenmill import LLM, SamplingParams

as_rows = cp.CpuPagedBackend.build_metadata


def orig(self, layout):
    """The rule before session 37 (outside batch-invariant mode): only lone generated rows are decodes."""
    qsl = layout.query_start_loc
    q_lens = [qsl[b + 1] - qsl[b] for b in range(len(layout.seq_lens))]
    as_decode = [n <= 1 and _prompt_rows(layout, b) == 0 for b, n in enumerate(q_lens)]
    decode = [b for b in range(len(q_lens)) if as_decode[b]]
    prefills = [p for b in range(len(q_lens)) if not as_decode[b] for p in _build_prefill(layout, b)]
    decodes = _build_decodes(layout, decode, q_lens) if decode else None
    return CpuPagedMetadata(layout.slot_mapping, layout.block_size, decodes, prefills, layout)

if __name__ == "__main__":
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    llm = LLM(dtype="auto", quantization="none", max_model_len=8192,
              speculative_config={"method": "ngram", "num_speculative_tokens": int(sys.argv[3]) if len(sys.argv) > 3 else 4})
    tok = llm.get_tokenizer()
    base = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep one by one "
            "and the river flows gently past the old mill at the edge of the village. ")
    ids = tok.encode(base * 200)[:ctx]
    prompts = [{"prompt_token_ids": ids[i:] } for i in range(batch)]
    sp = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)
    res = {"orig": [], "rows": []}
    outs = {}
    for r in range(3):
        for name, fn in (("orig", orig), ("rows", as_rows)):
            cp.CpuPagedBackend.build_metadata = fn
            t = time.perf_counter()
            o = llm.generate(prompts, sp, use_tqdm=False)
            res[name].append(time.perf_counter() - t)
            outs[name] = [x.outputs[0].token_ids for x in o]
    same = sum(a == b for a, b in zip(outs["orig"], outs["rows"]))
    print(f"ctx {ctx} batch {batch}: orig {[round(x,2) for x in res['orig']]} rows {[round(x,2) for x in res['rows']]}"
          f" best orig/rows {min(res['orig'])/min(res['rows']):.3f}x; identical {same}/{batch}")
