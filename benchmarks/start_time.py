"""How long a first or a later start takes: this tree against a git revision, alternated.

    python benchmarks/start_time.py [--measure kernel-build | cold-start | serve-start | cli] [--model FOLDER]
        [--serve-args "FLAGS"] [--cli-args "--version"] [--baseline-rev HEAD~1] [--rounds 2] [--json out.json]

kernel-build: `cpu_ops.load()` in a fresh process with an empty TORCH_EXTENSIONS_DIR (what a user's
first start does). cold-start: process start to the first generated token of the default model
(`LLM()` then one greedy token), kernels already built and every cache warm (one unrecorded start per
tree first): what every later start costs. serve-start: process start of `tokenmill serve MODEL`
(--model; default: the default model; more flags in --serve-args) to its first 200 on /health, caches warm likewise: what every
server start costs (the e2e tests start dozens). cli: `tokenmill ARGS` (--cli-args, default
`--version`) to its exit: what a command that loads no model costs. Each runs from this checkout and from a temporary
`git worktree` of the baseline revision, in the order ours, baseline, ours, baseline, ...; it prints
wall and CPU (user + system) seconds of each and the ratio of the best of each. The machine's other
load changes both, so read ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # serve-start uses tokenmill's health poll and free port
    sys.path.insert(0, str(REPO))
BUILD = "import sys, tokenmill; from tokenmill.kernels import cpu_ops; sys.exit(0 if cpu_ops.load() else 3)"
FIRST_TOKEN = ("from tokenmill import LLM, SamplingParams; "
               "LLM().generate(['Hello'], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)")


def _serve_until_healthy(env: dict, cwd: str, model: str | None, flags: list[str]) -> subprocess.CompletedProcess:
    from tokenmill.disagg.launchers import wait_healthy
    from tokenmill.fleet.replica import free_port
    port = free_port()
    cmd = [sys.executable, "-m", "tokenmill", "serve", *([model] if model else []), *flags, "--port", str(port)]
    log = Path(cwd) / "serve.log"  # a file, not a pipe: its access log lines would fill a pipe nobody reads
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:  # polled every 20 ms: the wall time is read to about that
        wait_healthy(f"http://127.0.0.1:{port}", lambda: None if proc.poll() is None else "exited", 600, poll_s=0.02)
        healthy = True
    except OSError:
        healthy = False
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return subprocess.CompletedProcess(cmd, 0 if healthy else proc.returncode or 1, "", log.read_text(errors="replace"))


def run_once(tree: Path, measure: str, model: str | None = None, serve_args: str = "", cli_args: str = "--version") -> dict:
    with tempfile.TemporaryDirectory(prefix="tm-start-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(tree), TOKENMILL_CPU_KERNELS="1")
        if measure == "kernel-build":
            env["TORCH_EXTENSIONS_DIR"] = tmp
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        if measure == "serve-start":  # wall until healthy; CPU until it exited after that
            run = _serve_until_healthy(env, tmp, model, shlex.split(serve_args))
        elif measure == "cli":
            run = subprocess.run([sys.executable, "-m", "tokenmill", *shlex.split(cli_args)], cwd=tmp, env=env,
                                 capture_output=True, text=True)
        else:
            run = subprocess.run([sys.executable, "-c", BUILD if measure == "kernel-build" else FIRST_TOKEN],
                                 cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"the {measure} from {tree} failed:\n{run.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measure", choices=["kernel-build", "cold-start", "serve-start", "cli"], default="kernel-build")
    p.add_argument("--model", default=None, help="serve-start: the model folder (default: the default model)")
    p.add_argument("--serve-args", default="", help="serve-start: more `tokenmill serve` flags, one string")
    p.add_argument("--cli-args", default="--version", help="cli: the `tokenmill` command's arguments, one string "
                   "(default: %(default)s)")
    p.add_argument("--baseline-rev", default="HEAD~1", help="git revision to compare with (default HEAD~1)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="tm-baseline-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), args.baseline_rev],
                       check=True)
        trees = (("ours", REPO), ("baseline", base))
        try:
            if args.measure != "kernel-build":  # kernels built, caches written: not recorded
                for _, tree in trees:
                    run_once(tree, args.measure, args.model, args.serve_args, args.cli_args)
            for r in range(args.rounds):
                for name, tree in trees:
                    runs[name].append(run_once(tree, args.measure, args.model, args.serve_args, args.cli_args))
                    print(f"round {r + 1} {name:8s} wall {runs[name][-1]['wall_s']:6.2f} s, "
                          f"cpu {runs[name][-1]['cpu_s']:6.2f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    best = {name: min(r["wall_s"] for r in rs) for name, rs in runs.items()}
    print(f"{args.measure}, best wall: ours {best['ours']:.2f} s, {args.baseline_rev} {best['baseline']:.2f} s; "
          f"ours / baseline {best['ours'] / best['baseline']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"measure": args.measure, "model": args.model, "serve_args": args.serve_args,
                                         "cli_args": args.cli_args,
                                         "baseline_rev": args.baseline_rev, "runs": runs,
                                         "best_wall_s": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
