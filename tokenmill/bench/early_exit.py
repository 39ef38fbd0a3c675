"""How often an early exit agrees with the whole model: the acceptance ceiling of `layer_skip`.

The default model (or --model) answers the chat questions of `bench/spec.py` greedily; then, with
those answers as context (teacher forcing), for each L in --layers the first L layers + final norm
+ LM head predict every answer token, and we count how often their argmax equals the token the
whole model chose. That is the per-token acceptance a greedy layer_skip draft of L layers can
reach; with a draft step costing c of a target step, no k drafts gain anything unless a > c
(k = 1: (1 + a) / (1 + c)). Computed with Hugging Face transformers, independently of our engine.

    python -m tokenmill.bench.early_exit [--layers 8,15,22,26,28,29] [--max-tokens 96] [--json out.json]
"""
from __future__ import annotations

import argparse
import sys

from tokenmill.bench.script import run_script, write_record


def agreement(model, answers: list[tuple[list[int], int]], num_layers: int) -> float:
    import torch
    agree = total = 0
    with torch.no_grad():
        for ids, prompt_len in answers:
            out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
            h = out.hidden_states[num_layers][0, prompt_len - 1:-1]  # after layer num_layers, before the norm
            pred = model.lm_head(model.model.norm(h)).argmax(-1)
            agree += int((pred == torch.tensor(ids[prompt_len:])).sum())
            total += len(ids) - prompt_len
    return agree / total


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from tokenmill.bench.spec import chat_prompts
    from tokenmill.engine.resolve import resolve_model_folder
    folder = resolve_model_folder(args.model)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers = []
    for prompt in chat_prompts(tok, args.num_questions):
        with torch.no_grad():
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=args.max_tokens, do_sample=False)
        answers.append((ids[0].tolist(), len(prompt)))
    n = model.config.num_hidden_layers
    if any(not 1 <= int(x) < n for x in args.layers.split(",")):
        raise SystemExit(f"--layers: each must be in [1, {n - 1}]")
    rows = [{"num_draft_layers": L, "agreement": agreement(model, answers, L)}
            for L in (int(x) for x in args.layers.split(","))]
    for row in rows:
        print(f"first {row['num_draft_layers']:>2} of {n} layers: top-1 agreement {row['agreement']:.3f}", flush=True)
    write_record(args.json, num_layers=n, answer_tokens=sum(len(i) - p for i, p in answers), results=rows)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--layers", default="8,15,22,26,28,29")
    p.add_argument("--num-questions", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
