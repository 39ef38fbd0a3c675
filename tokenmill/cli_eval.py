"""`tokenmill eval`: quality of one engine configuration through the public API — perplexity on
the shipped text (prompt logprobs over windows) and exact match on the shipped question set. Prints
a Markdown table row per run and a JSON record."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from tokenmill.engine.arg_utils import add_engine_args, add_model_args, engine_config, engine_kwargs, positive_int

TASKS = ("perplexity", "exact_match")
DEFAULT_PROMPT_STYLE = "few-shot"  # the best of the three for SmolLM2-135M-Instruct (docs/BENCHMARKS.md)
TABLE_HEADER = ("| model | dtype | kv_cache_dtype | quantization | perplexity | scored tokens (window) | "
                "exact match | prompt style | seconds |\n|---|---|---|---|---:|---:|---:|---|---:|")


def add_eval_parser(sub) -> None:
    from tokenmill.eval.exact_match import PROMPT_STYLES
    p = sub.add_parser("eval", help="perplexity and exact match of a model configuration",
                       description=__doc__)
    add_model_args(p)
    add_engine_args(p)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, from: " + ", ".join(TASKS))
    p.add_argument("--text", default=None, help="text file for perplexity (default: tokenmill/data/alice_ch1_2.txt)")
    p.add_argument("--window", type=positive_int, default=1024, help="perplexity window in tokens (default: 1024)")
    p.add_argument("--num-tokens", type=int, default=0, help="score only the first N tokens of the text (0: all)")
    p.add_argument("--dataset", default=None, help="JSONL question set (default: tokenmill/data/exact_match.jsonl)")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default=DEFAULT_PROMPT_STYLE,
                   help="exact-match prompts: few-shot text, chat (system instruction), or chat with example "
                        "turns (default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=16, help="tokens per exact-match answer (default: 16)")
    p.add_argument("--limit", type=int, default=0, help="first N questions only (0: all)")
    p.add_argument("--output-json", default=None, help="also write the JSON record (with every prediction) here")
    p.set_defaults(func=cmd_eval)


def parse_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise ValueError(f"--tasks must be a comma-separated list of {', '.join(TASKS)}; got {text!r}")
    return tasks


def cmd_eval(args: argparse.Namespace) -> int:
    tasks = parse_tasks(args.tasks)
    engine_config(args)  # every flag is checked before the model loads
    record = evaluate(args, tasks)
    print(TABLE_HEADER)
    print(table_row(record))
    print(json.dumps({k: v for k, v in record.items() if k != "predictions"}))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


def evaluate(args: argparse.Namespace, tasks: list[str]) -> dict:
    from tokenmill import LLM
    from tokenmill.data import read_text
    from tokenmill.eval.exact_match import DATASET, load_items, run_exact_match
    from tokenmill.eval.perplexity import perplexity

    t0 = time.perf_counter()
    llm = LLM(args.model, **engine_kwargs(args))  # --quantization among them
    cfg = llm.llm_engine.config
    record: dict = {"model": cfg.model.served_name, "dtype": cfg.model.dtype,
                    "kv_cache_dtype": cfg.cache.kv_cache_dtype, "quantization": cfg.model.quantization,
                    "date": time.strftime("%Y-%m-%d")}
    if "perplexity" in tasks:
        text = open(args.text, encoding="utf-8").read() if args.text else read_text()
        ppl = perplexity(llm, text, args.window, args.num_tokens)
        record["perplexity"] = dataclasses.asdict(ppl)
        record["perplexity"]["text"] = args.text or "tokenmill/data/alice_ch1_2.txt"
    if "exact_match" in tasks:
        items = load_items(args.dataset or DATASET)
        items = items[:args.limit] if args.limit else items
        em = run_exact_match(llm, items, args.prompt_style, args.max_tokens)
        record["exact_match"] = {"score": em.score, "correct": em.correct, "total": em.total,
                                 "prompt_style": em.prompt_style, "max_tokens": args.max_tokens,
                                 "by_category": em.by_category}
        record["predictions"] = em.predictions
    record["seconds"] = round(time.perf_counter() - t0, 1)
    return record


def table_row(r: dict) -> str:
    ppl, em = r.get("perplexity"), r.get("exact_match")
    cells = [r["model"], r["dtype"], r["kv_cache_dtype"], r["quantization"],
             f"{ppl['perplexity']:.4f}" if ppl else "-",
             f"{ppl['num_tokens']:,} ({ppl['window']})" if ppl else "-",
             f"{em['score']:.2f} ({em['correct']}/{em['total']})" if em else "-",
             em["prompt_style"] if em else "-", f"{r['seconds']:.0f}"]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    from tokenmill.cli import main
    sys.exit(main(["eval", *sys.argv[1:]]))
