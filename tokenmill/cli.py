"""tokenmill command line: serve | generate | chat | bench."""
from __future__ import annotations

import argparse
import sys

from tokenmill.engine.arg_utils import add_engine_args, engine_kwargs


def add_model_and_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder or .gguf (default: SmolLM2-135M-Instruct)")
    add_engine_args(p)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", type=int, default=None)


def sampling_params(args: argparse.Namespace):
    from tokenmill import SamplingParams
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed)


def cmd_generate(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    llm = LLM(args.model, **engine_kwargs(args))
    for out in llm.generate(args.prompts, sampling_params(args)):
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
            continue
        print(f"{out.prompt}{out.outputs[0].text}")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    llm = LLM(args.model, **engine_kwargs(args))
    messages: list[dict] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("tokenmill chat: empty line or Ctrl-D to quit")
    while True:
        try:
            user = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not user:
            return 0
        messages.append({"role": "user", "content": user})
        reply = llm.chat(messages, sampling_params(args), use_tqdm=False)[0].outputs[0].text
        print(f"assistant> {reply}")
        messages.append({"role": "assistant", "content": reply})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate completions for prompts")
    gen.add_argument("prompts", nargs="+")
    add_model_and_engine_args(gen)
    add_sampling_args(gen)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    chat.add_argument("--system", default=None)
    add_model_and_engine_args(chat)
    add_sampling_args(chat)
    chat.set_defaults(func=cmd_chat)

    _add_serve(sub)
    _add_bench(sub)
    return parser


def _add_serve(sub) -> None:
    from tokenmill.server.cli_args import add_serve_args

    def run_server(args: argparse.Namespace) -> int:
        from tokenmill.server.launch import run_server as run
        return run(args)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_serve_args(serve)
    serve.set_defaults(func=run_server)


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    from tokenmill.bench import offline, roofline
    offline.add_parser(bench)
    roofline.add_parser(bench)
    from tokenmill.bench import serve as bench_serve
    bench_serve.add_serve_parser(bench)
    bench_serve.add_compare_parser(bench)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as e:  # configuration errors: one line, no traceback
        print(f"tokenmill: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
