"""tokenmill command line: serve | serve-multi | generate | chat | eval | bench | sim | plan | router | cluster | fleet |
ledger."""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from tokenmill import __version__
from tokenmill.cli_chat import add_chat_parser
from tokenmill.cli_eval import add_eval_parser
from tokenmill.cli_sampling import GENERATE_DEFAULTS, add_sampling_args, check_sampling_args, resolve_sampling
from tokenmill.engine.arg_utils import add_engine_args, add_model_args, engine_config, engine_kwargs

if TYPE_CHECKING:
    from tokenmill.request import CompletionOutput, RequestOutput


class _Parser(argparse.ArgumentParser):
    """Flag errors in one line (the full usage of a command runs to dozens of lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def read_prompts(prompts: list[str]) -> list[str]:
    """The prompts, '-' read from stdin; ValueError for an empty one."""
    if prompts.count("-") > 1:
        raise ValueError("'-' (read the prompt from stdin) may be given once")
    out = [sys.stdin.read().removesuffix("\n") if p == "-" else p for p in prompts]
    for i, p in enumerate(out, 1):
        if not p:
            where = "from stdin " if prompts[i - 1] == "-" else ""
            raise ValueError(f"prompt {i} {where}is empty")
    return out


def cmd_generate(args: argparse.Namespace) -> int:
    prompts = read_prompts(args.prompts)
    config = engine_config(args)  # every flag is checked before the model loads
    check_sampling_args(args, GENERATE_DEFAULTS)
    from tokenmill import LLM
    llm = LLM(config.model, **engine_kwargs(args))
    params, _ = resolve_sampling(args, GENERATE_DEFAULTS, llm.llm_engine.config.model.path)
    outs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1 and sys.stderr.isatty())
    return print_outputs(outs, params.n)


def print_outputs(outs: list[RequestOutput], n: int) -> int:
    """Each output after a separator line when there are several; returns the exit status."""
    status = 0
    for i, out in enumerate(outs, 1):
        if out.error:
            print(f"tokenmill: error: prompt {i}: {out.error}", file=sys.stderr)
            status = 1
            continue
        for sample in out.outputs:
            if len(outs) > 1 or n > 1:
                print(_separator(i, len(outs), sample.index + 1, n))
            print(f"{out.prompt}{sample.text}")
            if sample.logprobs is not None:
                _print_logprobs(sample)
    return status


def _separator(prompt: int, prompts: int, sample: int, samples: int) -> str:
    parts = [f"prompt {prompt}/{prompts}"] if prompts > 1 else []
    parts += [f"sample {sample}/{samples}"] if samples > 1 else []
    return f"===== {', '.join(parts)} ====="


def _print_logprobs(sample: CompletionOutput) -> None:
    print("----- logprobs: token, logprob, [alternatives] -----")
    for token_id, entry in zip(sample.token_ids, sample.logprobs):
        chosen = entry[token_id]
        alts = ", ".join(f"{lp.decoded_token!r} {lp.logprob:.3f}" for t, lp in entry.items() if t != token_id)
        print(f"{chosen.decoded_token!r}\t{chosen.logprob:.4f}" + (f"\t[{alts}]" if alts else ""))


MODEL_RULE = ("The model: `serve` and `chat` take it as MODEL or --model; `generate`, whose positionals are "
              "prompts, as --model only.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tokenmill", description=__doc__, epilog=MODEL_RULE)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser(
        "generate", help="generate completions for prompts",
        description="Complete each prompt. Sampling defaults come from the model folder's "
                    "generation_config.json when it has one (as vLLM), else greedy; --max-tokens 128.",
        epilog=MODEL_RULE)
    gen.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text; '-' reads one from stdin")
    add_model_args(gen, positional=False)
    add_engine_args(gen)
    add_sampling_args(gen, GENERATE_DEFAULTS)
    gen.set_defaults(func=cmd_generate)

    add_chat_parser(sub)
    _add_serve(sub)
    add_eval_parser(sub)
    _add_bench(sub)
    from tokenmill.cli_quantize import add_quantize_parser
    add_quantize_parser(sub)
    from tokenmill.sim.cli import add_plan_parser, add_sim_parser
    add_sim_parser(sub)
    add_plan_parser(sub)
    from tokenmill.fleet.cli import add_fleet_parser, add_ledger_parser
    add_fleet_parser(sub)
    add_ledger_parser(sub)
    from tokenmill.disagg.router_cli import add_router_parser
    add_router_parser(sub)
    from tokenmill.disagg.cluster import add_cluster_parser
    add_cluster_parser(sub)
    return parser


def _add_serve(sub) -> None:
    from tokenmill.server.cli_args import add_serve_args

    def run_server(args: argparse.Namespace) -> int:
        from tokenmill.server.launch import run_server as run
        return run(args)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server", epilog=MODEL_RULE)
    add_serve_args(serve)
    serve.set_defaults(func=run_server)

    from tokenmill.server.multi_args import add_arguments as add_multi_args

    def run_multi(args: argparse.Namespace) -> int:
        from tokenmill.server.multi_launch import run
        return run(args)

    multi = sub.add_parser("serve-multi", help="one server process holding several models, one awake at a time "
                           "(sleep mode: weights kept, KV released)")
    add_multi_args(multi)
    multi.set_defaults(func=run_multi)


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True)
    from tokenmill.bench import offline, roofline
    offline.add_parser(bench)
    roofline.add_parser(bench)
    from tokenmill.bench import serve as bench_serve
    bench_serve.add_serve_parser(bench)
    bench_serve.add_compare_parser(bench)


def console_main() -> NoReturn:
    """The `tokenmill` command: an engine command re-executes itself with tcmalloc first (malloc.py)."""
    from tokenmill.malloc import reexec_with_tcmalloc
    argv = sys.argv[1:]
    reexec_with_tcmalloc(next((a for a in argv if not a.startswith("-")), None))
    sys.exit(main(argv))


def main(argv: list[str] | None = None) -> int:
    from tokenmill.sim.cli import normalize_argv
    args = build_parser().parse_args(normalize_argv(list(sys.argv[1:] if argv is None else argv)))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `tokenmill generate ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as e:  # bad input or files: one line, no traceback
        print(f"tokenmill: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
