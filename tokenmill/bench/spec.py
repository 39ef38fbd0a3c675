"""Speculative decoding against plain decoding, same engine settings, same run.

Workloads:
- `repeat`: chat prompts that ask the model to repeat, lightly edit or restate a passage given in
  the prompt (`tokenmill/data/passages.json`, written for this repository) — where prompt lookup
  should shine;
- `random`: W1-style random token prompts (U[64,512]) and outputs of 128 tokens, ignore_eos — no
  repetition to exploit, so speculation must cost (almost) nothing.

For each batch size (requests submitted at once), each configuration (`off` and each method) runs
the same requests (greedy: the outputs must be identical), rounds alternated, best of `--rounds`.
Reported: mean TPOT over requests (ms), output tok/s, acceptance rate (accepted / drafted tokens)
and mean accepted length (tokens emitted per verification step).

    python -m tokenmill.bench.spec [--batch-sizes 1,4,32] [--workloads repeat,random] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import resources

from tokenmill.bench.script import run_script, write_record
from tokenmill.request import SpecDecodingStats

INSTRUCTIONS = ["Repeat the following text exactly, word for word.",
                "Rewrite the following text, changing only the first sentence.",
                "Copy the following text and put it in quotation marks."]


def repeat_prompts(tokenizer, n: int) -> list[list[int]]:
    passages = json.loads(resources.files("tokenmill.data").joinpath("passages.json").read_text())
    out = []
    for i in range(n):
        msg = f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{passages[i % len(passages)]}"
        ids = tokenizer.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True,
                                            tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids))
    return out


def run_config(llm, prompts: list[list[int]], workload: str, max_tokens: int) -> dict:
    from tokenmill import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=workload == "random")
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tpots = []
    for o in outs:
        m, n = o.metrics, len(o.outputs[0].token_ids)
        if n > 1:
            tpots.append((m.last_token_time - m.first_token_time) / (n - 1))
    spec = SpecDecodingStats.merged([o.metrics.spec_decoding for o in outs if o.metrics.spec_decoding])
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": seconds, "output_tokens": tokens, "output_tok_s": tokens / seconds,
            "tpot_ms": 1000 * sum(tpots) / len(tpots), "acceptance": spec.acceptance_rate,
            "mean_accepted_length": spec.mean_accepted_length or None,
            "outputs": [o.outputs[0].token_ids for o in outs]}


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine, make_w1
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    common = dict(dtype=args.dtype, max_num_seqs=max(batch_sizes))
    spec = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens}
    if args.disable_by_batch_size is not None:
        spec["disable_by_batch_size"] = args.disable_by_batch_size
    engines = {"off": LLM(args.model, **common), "ngram": LLM(args.model, speculative_config=spec, **common)}
    tok = engines["off"].get_tokenizer()
    results = []
    for workload in args.workloads.split(","):
        for b in batch_sizes:
            if workload == "repeat":
                prompts, max_tokens = repeat_prompts(tok, b), args.max_tokens
            else:
                prompts, max_tokens = make_w1(b, tok.vocab_size, seed=1).prompts, 128
            best: dict[str, dict] = {}
            for _ in range(args.rounds):
                for name, llm in engines.items():
                    res = run_config(llm, prompts, workload, max_tokens)
                    if name not in best or res["output_tok_s"] > best[name]["output_tok_s"]:
                        best[name] = res
            identical = best["off"].pop("outputs") == best["ngram"].pop("outputs")
            row = {"workload": workload, "batch": b, "identical_outputs": identical, **{k: v for k, v in best.items()}}
            row["tpot_speedup"] = best["off"]["tpot_ms"] / best["ngram"]["tpot_ms"]
            row["throughput_ratio"] = best["ngram"]["output_tok_s"] / best["off"]["output_tok_s"]
            results.append(row)
            acc = best["ngram"]["acceptance"]
            print(f"{workload:>7} batch {b:>3}: TPOT off {best['off']['tpot_ms']:.1f} ms, ngram "
                  f"{best['ngram']['tpot_ms']:.1f} ms ({row['tpot_speedup']:.2f}x lower); out tok/s "
                  f"{best['off']['output_tok_s']:.1f} vs {best['ngram']['output_tok_s']:.1f} "
                  f"({row['throughput_ratio']:.2f}x); acceptance {'-' if acc is None else f'{acc:.2f}'}, mean "
                  f"accepted length {best['ngram']['mean_accepted_length'] or '-'}; identical outputs {identical}",
                  flush=True)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; dtype {args.dtype}; best of {args.rounds}")
    write_record(args.json, results=results)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", default="1,4,32")
    p.add_argument("--workloads", default="repeat,random")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--disable-by-batch-size", type=int, default=None,
                   help="speculative_config.disable_by_batch_size (default: the engine's); a large value keeps "
                        "speculation on at every batch size, to find where it stops paying")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
