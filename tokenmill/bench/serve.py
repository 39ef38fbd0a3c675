"""`tokenmill bench serve` / `tokenmill bench compare`: a serving benchmark for any
OpenAI-compatible endpoint (in the manner of `vllm bench serve`).

    python -m tokenmill.bench.serve serve --base-url http://127.0.0.1:8000 --workload chat \\
        --sweep 1,2,4,8 --slo-ttft-ms 500 --slo-tpot-ms 50 --price-per-hour 3.5 --out out/run1
    python -m tokenmill.bench.serve compare out/run1 out/run2

Metric definitions: see `tokenmill.bench.metrics`. Workloads and arrivals: see
`tokenmill.bench.workloads`. Timing and token counting: see `tokenmill.bench.client`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tokenmill.bench.serve_args import add_serve_arguments
from tokenmill.bench.workloads import BenchError

# compare, plan and runner (with httpx and the plots) load when a benchmark runs: every `tokenmill`
# command builds this parser, `tokenmill serve` included

EXIT_USAGE = 2


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="benchmark an OpenAI-compatible server",
        description="Benchmark an OpenAI-compatible streaming endpoint: latency (TTFT, TPOT, ITL, "
        "E2E), throughput, goodput under SLOs and cost per token.",
    )
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)
    return p


def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "compare", help="compare two benchmark runs side by side",
        description="Print two runs' summaries (results.json, sweep.json or their folders) side by "
        "side with ratios B/A.")
    p.add_argument("run_a", help="baseline run")
    p.add_argument("run_b", help="run compared to the baseline")
    p.set_defaults(func=run_compare)
    return p


def _fail(command: str, e: Exception) -> int:
    print(f"tokenmill bench {command}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return EXIT_USAGE


def run_serve(args: argparse.Namespace) -> int:
    from tokenmill.bench.plan import make_plan
    from tokenmill.bench.runner import EXIT_INTERRUPTED, execute
    try:
        return execute(make_plan(args))
    except (BenchError, OSError) as e:
        return _fail("serve", e)
    except KeyboardInterrupt:
        print("tokenmill bench serve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run_compare(args: argparse.Namespace) -> int:
    from tokenmill.bench.compare import compare_runs
    try:
        print(compare_runs(args.run_a, args.run_b))
    except BenchError as e:
        return _fail("compare", e)
    return 0


# ---------------------------------------------------------------- standalone entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill bench", description="Serving benchmarks.")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    add_serve_parser(sub)
    add_compare_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tokenmill.bench.serve [serve] ARGS` or `... compare A B`."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] not in ("serve", "compare", "-h", "--help"):
        args_list.insert(0, "serve")
    args = build_parser().parse_args(args_list)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
