"""Sharing the CPU: how a short generation slows down when other processes use the cores.

For each load — none, two busy loops (one per core of a 2-core machine), a parallel C++ compile
(two compilers at once, as `make -j2`) — and each thread policy, a fresh process loads the default
model, warms up, and times a greedy generation of `--tokens` tokens (median of `--repeats`). The
figure is the slowdown against the same policy on the idle machine; a fair share of two cores with
two other busy processes is 2x.

Policies: `adaptive` (tokenmill's default: threads from affinity and cgroup quota, fewer while
other processes keep the cores busy), `fixed` (all cores, always: what tokenmill did before),
`one` (--num-threads 1), `passive` (all cores with OMP_WAIT_POLICY=PASSIVE: threads sleep instead of
spinning at barriers).

Every load process is this benchmark's own child, bounded in time, and ended by its PID.

    python -m tokenmill.bench.contention [--tokens 40] [--policies adaptive,fixed,one,passive] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenmill.bench.script import run_script, write_record

POLICIES = {
    "adaptive": ({}, None),
    "fixed": ({}, "all"),
    "one": ({}, 1),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, "all"),
}

CHILD = r"""
import json, os, sys, time, statistics
from tokenmill import LLM, SamplingParams
tokens, repeats, threads, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
kw = {} if threads == "none" else {"num_threads": len(os.sched_getaffinity(0)) if threads == "all" else int(threads)}
llm = LLM(dtype=dtype, **kw)
prompt = "The history of the lighthouse on the northern cape begins"
params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
for _ in range(2):
    llm.generate(prompt, params, use_tqdm=False)
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    llm.generate(prompt, params, use_tqdm=False)
    times.append(time.perf_counter() - t0)
threads_now = llm.llm_engine.runner.threads.threads
print("RESULT " + json.dumps({"times": times, "threads_at_end": threads_now}))
"""

BUSY = "import time\nend = time.time() + {limit}\nwhile time.time() < end:\n    pass\n"


def _compile_command(out_dir: str) -> list[str]:
    from torch.utils.cpp_extension import include_paths
    src = Path(__file__).resolve().parents[1] / "kernels" / "csrc" / "panel_gemm.cpp"
    return ["c++", "-O2", "-std=c++17", *(f"-I{p}" for p in include_paths()), "-c", str(src),
            "-o", os.path.join(out_dir, "x.o")]


def start_load(kind: str, limit_s: float, tmp: str) -> list[subprocess.Popen]:
    if kind == "idle":
        return []
    procs = []
    for i in range(2):
        if kind == "busy":
            cmd = [sys.executable, "-c", BUSY.format(limit=limit_s)]
        else:  # compile: one compiler after another until the time limit, two at once
            loop = f"end=$((SECONDS+{int(limit_s)})); while [ $SECONDS -lt $end ]; do {' '.join(_compile_command(os.path.join(tmp, str(i))))}; done"
            os.makedirs(os.path.join(tmp, str(i)), exist_ok=True)
            cmd = ["bash", "-c", loop]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    time.sleep(1.0)  # let the load reach full speed
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)  # our own session: the bash loop and its compiler
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(timeout=30)


def measure(policy: str, load: str, args: argparse.Namespace, tmp: str) -> dict:
    env_extra, threads = POLICIES[policy]
    env = dict(os.environ, **env_extra)
    procs = start_load(load, args.load_limit_s, tmp)
    try:
        run = subprocess.run([sys.executable, "-c", CHILD, str(args.tokens), str(args.repeats),
                              "none" if threads is None else str(threads), args.dtype],
                             env=env, capture_output=True, text=True, timeout=args.load_limit_s)
    finally:
        stop_load(procs)
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    if run.returncode != 0 or line is None:
        raise RuntimeError(f"{policy}/{load} failed:\n{run.stderr[-2000:]}")
    res = json.loads(line[len("RESULT "):])
    res["median_s"] = statistics.median(res["times"])
    return res


def run(args: argparse.Namespace) -> int:
    from tokenmill.bench.offline import machine
    policies = args.policies.split(",")
    loads = args.loads.split(",")
    unknown = [p for p in policies if p not in POLICIES] + [x for x in loads if x not in ("idle", "busy", "compile")]
    if unknown:
        print(f"error: unknown policy or load {unknown}; policies {', '.join(POLICIES)}, loads idle,busy,compile",
              file=sys.stderr)
        return 2
    results: dict[str, dict[str, dict]] = {p: {} for p in policies}
    with tempfile.TemporaryDirectory() as tmp:
        for load in loads:
            for policy in policies:
                res = measure(policy, load, args, tmp)
                results[policy][load] = res
                print(f"{load:>8} {policy:>9}: {res['median_s']:.2f} s for {args.tokens} tokens "
                      f"(runs {', '.join(f'{t:.2f}' for t in res['times'])}; threads at end {res['threads_at_end']})",
                      flush=True)
    print(f"\nmachine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; dtype {args.dtype}; "
          f"{args.tokens} tokens, median of {args.repeats}")
    print(f"{'policy':>9}" + "".join(f"{x + ' (s)':>14}" for x in loads) + "".join(
        f"{x + ' / idle':>16}" for x in loads if x != "idle"))
    for p in policies:
        row = results[p]
        base = row.get("idle", {}).get("median_s")
        cells = "".join(f"{row[x]['median_s']:>14.2f}" for x in loads)
        ratios = "".join(f"{row[x]['median_s'] / base:>15.2f}x" if base else f"{'-':>16}" for x in loads if x != "idle")
        print(f"{p:>9}{cells}{ratios}")
    write_record(args.json, results=results)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--loads", default="idle,busy,compile")
    p.add_argument("--load-limit-s", type=float, default=300.0, help="no load process outlives this")
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
