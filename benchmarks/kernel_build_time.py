"""How long the first start's kernel build takes: this tree against a git revision, alternated.

    python benchmarks/kernel_build_time.py [--baseline-rev HEAD~1] [--rounds 2] [--json out.json]

Each build runs `cpu_ops.load()` in a fresh process with an empty TORCH_EXTENSIONS_DIR (what a user's
first start does), from this checkout and from a temporary `git worktree` of the baseline revision, in
the order ours, baseline, ours, baseline, ...; it prints wall and CPU (user + system) seconds of each
build and the ratio of the best of each. The machine's other load changes both, so read ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = "import sys, tokenmill; from tokenmill.kernels import cpu_ops; sys.exit(0 if cpu_ops.load() else 3)"


def build_once(tree: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="tm-build-") as cache:
        env = dict(os.environ, PYTHONPATH=str(tree), TORCH_EXTENSIONS_DIR=cache, TOKENMILL_CPU_KERNELS="1")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", CHECK], cwd=cache, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"the build from {tree} failed:\n{run.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-rev", default="HEAD~1", help="git revision to compare with (default HEAD~1)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="tm-baseline-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), args.baseline_rev],
                       check=True)
        try:
            for r in range(args.rounds):
                for name, tree in (("ours", REPO), ("baseline", base)):
                    runs[name].append(build_once(tree))
                    print(f"round {r + 1} {name:8s} wall {runs[name][-1]['wall_s']:6.1f} s, "
                          f"cpu {runs[name][-1]['cpu_s']:6.1f} s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    best = {name: min(r["wall_s"] for r in rs) for name, rs in runs.items()}
    print(f"best wall: ours {best['ours']:.1f} s, {args.baseline_rev} {best['baseline']:.1f} s; "
          f"ours / baseline {best['ours'] / best['baseline']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"baseline_rev": args.baseline_rev, "runs": runs, "best_wall_s": best},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
