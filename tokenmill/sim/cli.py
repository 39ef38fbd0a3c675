"""`tokenmill sim [run]` | `tokenmill sim profile` | `tokenmill sim validate`, and `tokenmill plan`."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SIM_COMMANDS = ("run", "profile", "validate")


def add_sim_parser(sub: Any) -> None:
    from tokenmill.bench.serve_args import add_serve_arguments
    from tokenmill.sim.args import add_cluster_args, add_model_source_args, add_scheduler_args

    sim = sub.add_parser("sim", help="simulate a serving cluster on the real scheduler",
                         description="Cluster simulator: the real scheduler and KV manager with a performance "
                         "model for step times. `tokenmill sim ARGS` is `tokenmill sim run ARGS`.")
    cmds = sim.add_subparsers(dest="sim_command", required=True)
    run = cmds.add_parser("run", help="simulate a `bench serve` run (same flags, same results.json)")
    add_serve_arguments(run, endpoint=False)
    run.add_argument("--endpoint", choices=("completions", "chat"),
                     help="the endpoint simulated: chat applies the model's chat template to prompts when "
                     "--tokenizer is given (default: as bench serve)")
    add_model_source_args(run)
    add_scheduler_args(run)
    add_cluster_args(run)
    run.set_defaults(func=_run)

    prof = cmds.add_parser("profile", help="fit a performance model to the real engine on this machine")
    from tokenmill.engine.arg_utils import add_engine_args, add_model_args
    add_model_args(prof)
    add_engine_args(prof)
    prof.add_argument("--output-len", type=int, default=6, help="decode steps per grid point (default: %(default)s)")
    prof.add_argument("--repeats", type=int, default=3, help="runs of each grid point; each step keeps its fastest "
                      "(default: %(default)s)")
    prof.add_argument("--out", required=True, help="profile JSON to write")
    prof.add_argument("--refit", metavar="PROFILE", help="fit a profile's recorded steps again (no measuring of "
                      "the engine; with --serve, the serving path is measured again)")
    prof.add_argument("--serve", action="store_true", help="also measure the serving path through a live `tokenmill "
                      "serve` (HTTP, tokenization, SSE streaming; its own calibration workload) and fit its terms")
    prof.set_defaults(func=_profile)

    from tokenmill.sim.validate import add_validate_args
    val = cmds.add_parser("validate", help="measured server vs simulator on this machine: error per metric")
    add_validate_args(val)
    val.set_defaults(func=_validate)


def add_plan_parser(sub: Any) -> None:
    from tokenmill.sim.plan_cli import add_plan_args
    plan = sub.add_parser("plan", help="cheapest cluster configurations meeting a latency SLO")
    add_plan_args(plan)
    plan.set_defaults(func=_plan)


def normalize_argv(argv: list[str]) -> list[str]:
    """`tokenmill sim --workload chat ...` means `tokenmill sim run --workload chat ...`."""
    if len(argv) >= 1 and argv[0] == "sim" and (len(argv) == 1 or argv[1] not in (*SIM_COMMANDS, "-h", "--help")):
        return ["sim", "run", *argv[1:]]
    return argv


def _run(args: argparse.Namespace) -> int:
    from tokenmill.sim.run import main_sim
    return main_sim(args)


def _profile(args: argparse.Namespace) -> int:
    from tokenmill.sim.profile import refit, run_profile
    if args.refit:
        from tokenmill.sim.hardware import load_profile
        record = refit(load_profile(args.refit))
    else:
        record = run_profile(args)
    if args.serve:
        from tokenmill.sim.serve_profile import measure_serving, serve_args
        log = Path(tempfile.gettempdir()) / f"tokenmill-sim-profile-serve-{os.getpid()}.log"
        print("measuring the serving path through tokenmill serve", flush=True)
        record["serving"] = measure_serving(record, serve_args(record, args), int(record["num_kv_blocks"]),
                                            int(record["max_num_batched_tokens"]), log)
        terms = record["serving"]["terms"]
        print("serving path: " + ", ".join(f"{k} {1000 * v:.3f} ms" for k, v in terms.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    fit = record["fit"]
    print(f"fitted {fit['num_steps']} steps: median |error| {100 * fit['median_abs_rel_err']:.1f}%, "
          f"p90 {100 * fit['p90_abs_rel_err']:.1f}%; written to {args.out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from tokenmill.sim.validate import run_validate
    return run_validate(args)


def _plan(args: argparse.Namespace) -> int:
    from tokenmill.sim.plan_cli import run_plan
    try:
        return run_plan(args)
    except ValueError as e:
        print(f"tokenmill plan: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
