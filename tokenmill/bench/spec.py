"""Speculative decoding against plain decoding, same engine settings, same run.

Workloads:
- `repeat`: chat prompts that ask the model to repeat, lightly edit or restate a passage given in
  the prompt (`tokenmill/data/passages.json`, written for this repository) — where prompt lookup
  should shine;
- `chat`: plain chat questions (no passage to copy), greedy up to --max-tokens or EOS — the
  workload of a model-run draft (layer_skip, draft_model);
- `random`: W1-style random token prompts (U[64,512]) and outputs of 128 tokens, ignore_eos — no
  repetition to exploit, so speculation must cost (almost) nothing.

Configurations: `off` and one per method in --method (ngram, layer_skip, draft_model); layer_skip
once per value of --num-draft-layers (comma-separated); draft_model drafts with --draft-model (its
weights in --draft-quantization; e.g. the default model's own GGUF, kept quantized, drafting for
the same model in float: `--quantization none --draft-model <the .gguf>`).
For each batch size (requests submitted at once; --groups successive groups of that many), each
configuration runs the same requests (greedy: the outputs must be identical), rounds alternated,
best of `--rounds`. Reported: mean TPOT over requests (ms), output tok/s, acceptance rate
(accepted / drafted tokens), mean accepted length (tokens emitted per verification step), and
the counters: drafted, accepted, emitted, accepted at each draft position.

    python -m tokenmill.bench.spec [--method ngram,layer_skip] [--num-draft-layers 8,15,22]
        [--batch-sizes 1,4,32] [--workloads repeat,chat,random] [--json out.json]
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
QUESTIONS = ["Explain how a refrigerator keeps food cold.", "Write a short poem about the sea.",
             "What are three tips for learning a new language?", "Why is the sky blue?",
             "Describe a good breakfast for a busy morning.", "How does a bicycle stay upright?",
             "Give me a few ideas for a rainy weekend.", "What is the difference between weather and climate?"]


def _chat_ids(tokenizer, message: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)


def repeat_prompts(tokenizer, n: int) -> list[list[int]]:
    passages = json.loads(resources.files("tokenmill.data").joinpath("passages.json").read_text())
    return [_chat_ids(tokenizer, f"{INSTRUCTIONS[i % len(INSTRUCTIONS)]}\n\n{passages[i % len(passages)]}")
            for i in range(n)]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    return [_chat_ids(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def run_config(llm, groups: list[list[list[int]]], workload: str, max_tokens: int) -> dict:
    """Each group of prompts submitted at once, the groups one after another."""
    from tokenmill import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=workload == "random")
    llm.reset_prefix_cache()
    outs, seconds = [], 0.0
    for prompts in groups:
        t0 = time.perf_counter()
        outs += llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds += time.perf_counter() - t0
    tpots = []
    for o in outs:
        m, n = o.metrics, len(o.outputs[0].token_ids)
        if n > 1:
            tpots.append((m.last_token_time - m.first_token_time) / (n - 1))
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"seconds": seconds, "output_tokens": tokens, "output_tok_s": tokens / seconds,
            "tpot_ms": 1000 * sum(tpots) / len(tpots),
            **spec_counters([o.metrics.spec_decoding for o in outs if o.metrics.spec_decoding]),
            **draft_cost(llm), "outputs": [o.outputs[0].token_ids for o in outs]}


def draft_cost(llm) -> dict:
    """A model-run draft's own estimates at the end of the run: per-token acceptance, one draft
    step's cost relative to an engine step, and the best expected gain over k (what it acts on)."""
    length = getattr(llm.llm_engine.runner.proposer, "length", None)
    if length is None:
        return {}
    gains = length.gains()
    return {"draft_acceptance_estimate": length.acceptance, "draft_step_cost_ratio": length.cost_ratio,
            "expected_gain_by_k": gains}


def spec_counters(stats: list[SpecDecodingStats]) -> dict:
    s = SpecDecodingStats.merged(stats)
    return {"acceptance": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_length or None,
            "verification_steps": s.num_drafts, "drafted": s.num_draft_tokens, "accepted": s.num_accepted_tokens,
            "emitted": s.num_accepted_tokens + s.num_drafts,
            "acceptance_by_position": [n / s.num_drafts for n in s.accepted_per_position]}


def spec_configs(args: argparse.Namespace) -> dict[str, dict | None]:
    """Name -> speculative_config, one per method (layer_skip: one per --num-draft-layers); with
    --control also `off2`, a second engine without speculation built last (an A/A check of the
    machine's noise and of anything that favours one engine over another)."""
    base = {"num_speculative_tokens": args.num_speculative_tokens}
    if args.disable_by_batch_size is not None:
        base["disable_by_batch_size"] = args.disable_by_batch_size
    configs = {}
    for method in args.method.split(","):
        if method == "layer_skip":
            for layers in (args.num_draft_layers.split(",") if args.num_draft_layers else [None]):
                extra = {"num_draft_layers": int(layers)} if layers else {}
                configs[f"layer_skip{layers or ''}"] = {"method": method, **base, **extra}
        elif method == "draft_model":
            if not args.draft_model:
                raise SystemExit("--method draft_model needs --draft-model (an HF folder or .gguf)")
            quant = {"quantization": args.draft_quantization} if args.draft_quantization else {}
            configs["draft_model"] = {"method": method, "model": args.draft_model, **base, **quant}
        else:
            configs[method] = {"method": method, **base}
    if args.control:
        configs["off2"] = None
    return configs


def workload_groups(workload: str, tok, batch: int, num_groups: int) -> list[list[list[int]]]:
    from tokenmill.bench.offline import make_w1
    if workload == "random":
        return [make_w1(batch, tok.vocab_size, seed=1 + g).prompts for g in range(num_groups)]
    make = repeat_prompts if workload == "repeat" else chat_prompts
    prompts = make(tok, batch * num_groups)
    return [prompts[g * batch:(g + 1) * batch] for g in range(num_groups)]


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    common = dict(dtype=args.dtype, quantization=args.quantization, max_num_seqs=max(batch_sizes),
                  kv_cache_memory_gb=args.kv_cache_memory_gb, batch_invariant=args.batch_invariant)
    configs = spec_configs(args)
    engines = {"off": LLM(args.model, **common)}
    engines.update({name: LLM(args.model, speculative_config=cfg, **common) for name, cfg in configs.items()})
    tok = engines["off"].get_tokenizer()
    results = []
    for workload in args.workloads.split(","):
        for b in batch_sizes:
            groups = workload_groups(workload, tok, b, args.groups)
            max_tokens = 128 if workload == "random" else args.max_tokens
            best: dict[str, dict] = {}
            for _ in range(args.rounds):
                for name, llm in engines.items():
                    res = run_config(llm, groups, workload, max_tokens)
                    if name not in best or res["output_tok_s"] > best[name]["output_tok_s"]:
                        best[name] = res
            outputs = {name: res.pop("outputs") for name, res in best.items()}
            row = {"workload": workload, "batch": b, "groups": args.groups, **best, "ratios": {}}
            for name in configs:
                ratio = {"identical_outputs": outputs[name] == outputs["off"],
                         "tpot_speedup": best["off"]["tpot_ms"] / best[name]["tpot_ms"],
                         "throughput_ratio": best[name]["output_tok_s"] / best["off"]["output_tok_s"]}
                row["ratios"][name] = ratio
                _print_cell(workload, b, name, best["off"], best[name], ratio)
            results.append(row)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; dtype {args.dtype}; best of {args.rounds}")
    write_record(args.json, configs=configs, results=results)
    return 0


def _print_cell(workload: str, b: int, name: str, off: dict, res: dict, ratio: dict) -> None:
    acc = res["acceptance"]
    print(f"{workload:>7} batch {b:>3} {name:>12}: TPOT {off['tpot_ms']:.1f} -> {res['tpot_ms']:.1f} ms "
          f"({ratio['tpot_speedup']:.2f}x lower); out tok/s {off['output_tok_s']:.1f} -> {res['output_tok_s']:.1f} "
          f"({ratio['throughput_ratio']:.2f}x); acceptance {'-' if acc is None else f'{acc:.2f}'}, mean accepted "
          f"length {res['mean_accepted_length'] or '-'}; drafted {res['drafted']}; identical outputs "
          f"{ratio['identical_outputs']}", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-sizes", default="1,4,32")
    p.add_argument("--workloads", default="repeat,random", help="repeat, chat, random (comma-separated)")
    p.add_argument("--groups", type=int, default=1, help="successive groups of batch-size requests per cell")
    p.add_argument("--method", default="ngram", help="ngram, layer_skip, draft_model (comma-separated)")
    p.add_argument("--num-draft-layers", default=None,
                   help="layer_skip: comma-separated values, one configuration each (default: the engine's)")
    p.add_argument("--draft-model", default=None, help="draft_model: an HF folder or .gguf with the same tokenizer")
    p.add_argument("--batch-invariant", action="store_true",
                   help="every engine in batch-invariant mode (process-wide): greedy identity in bfloat16 too")
    p.add_argument("--quantization", default=None, help="the target's weight format (default: the model file's own)")
    p.add_argument("--draft-quantization", default=None,
                   help="draft_model's weight format (default: its file's own, e.g. gguf blocks for a .gguf)")
    p.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    p.add_argument("--control", action="store_true", help="add off2: speculation off, engine built last")
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
