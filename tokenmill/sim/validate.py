"""`tokenmill sim validate`: the simulator against the real server on this machine.

For each workload: start `tokenmill serve` (fixed threads, KV blocks and batch budget, the same the
simulator is given), run `tokenmill bench serve` at each request rate, run `tokenmill sim` with the
same flags and seed (so the same requests arrive at the same offsets), and tabulate the error of
each metric: (simulated - measured) / measured. Each side is a real CLI run writing its own
results.json, so `tokenmill bench compare` also works on any pair.

Run it under `flock /tmp/tokenmill-bench.lock` on a shared machine: the measured side is wall-clock.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tokenmill.bench.fmt import md_table

METRICS = (("ttft_ms.p50", "TTFT p50"), ("ttft_ms.p99", "TTFT p99"), ("tpot_ms.p50", "TPOT p50"),
           ("tpot_ms.p99", "TPOT p99"), ("output_throughput", "throughput"))

# small enough for a 2-core CPU; each workload: (options, three request rates)
DEFAULT_CASES: dict[str, tuple[list[str], list[float]]] = {
    "chat": (["input_len=128", "output_len=32", "max_input_len=1024", "max_output_len=128"], [0.25, 0.5, 1.0]),
    "long-short-mix": (["short_input_len=128", "long_input_len=1024", "long_fraction=0.2", "output_len=32"],
                       [0.25, 0.5, 1.0]),
    "shared-prefix": (["num_groups=4", "prefix_len=512", "suffix_len=64", "output_len=32"], [0.25, 0.5, 1.0]),
}


def add_validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for every run's results and the error table")
    p.add_argument("--workloads", default=",".join(DEFAULT_CASES), help="(default: %(default)s)")
    p.add_argument("--rates", help="R1,R2,R3 for every workload (default: per workload, see validate.py)")
    p.add_argument("--num-requests", type=int, default=40, help="per run (default: %(default)s)")
    p.add_argument("--profile", help="profile JSON (default: the shipped CPU profile)")
    p.add_argument("--num-threads", type=int, default=1, help="server threads; 1 keeps a shared machine's other "
                   "jobs from stalling the model's thread barriers (default: %(default)s)")
    p.add_argument("--num-kv-blocks", type=int, default=4096, help="both sides (default: %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=1024, help="both sides (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sim-only", action="store_true",
                   help="keep the measured runs already in --out; simulate again (e.g. with a new --profile)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]


def start_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen:
    return launch_server(["--num-threads", str(args.num_threads), "--num-kv-blocks", str(args.num_kv_blocks),
                          "--max-num-batched-tokens", str(args.max_num_batched_tokens)], port, log)


def launch_server(serve_args: list[str], port: int, log: Path) -> subprocess.Popen:
    """`tokenmill serve SERVE_ARGS` on 127.0.0.1:port, once /health answers."""
    import httpx  # here, not at the top: every `tokenmill` command imports this module for its flags
    cmd = _cli("serve", "--host", "127.0.0.1", "--port", str(port), *serve_args)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"the server did not become healthy in 600 s; see {log}")


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))["summary"]


def run_case(args: argparse.Namespace, workload: str, opts: list[str], rate: float, port: int, out: Path,
             tokenizer: str, index: int) -> tuple[dict[str, Any], dict[str, Any], tuple[float, float]]:
    # a new seed per rate: the server's prefix cache still holds the previous run's prompts
    common = ["--workload", workload, "--num-requests", str(args.num_requests), "--request-rate", str(rate),
              "--seed", str(args.seed + index), "--tokenizer", tokenizer, "--endpoint", "completions",
              "--disable-tqdm"]
    for o in opts:
        common += ["--workload-opt", o]
    measured, simulated = out / "measured" / workload / f"rate_{rate:g}", out / "sim" / workload / f"rate_{rate:g}"
    if args.sim_only:  # the measured run is already there: simulate again (a new profile)
        load = tuple(json.loads((measured / "load.json").read_text())) if (measured / "load.json").exists() else ()
    else:
        load_before = os.getloadavg()[0]
        subprocess.run(_cli("bench", "serve", "--base-url", f"http://127.0.0.1:{port}", *common, "--out",
                            str(measured)), check=True, stdout=subprocess.DEVNULL)
        load = (load_before, os.getloadavg()[0])  # 1-minute load average before and after the measured run
        (measured / "load.json").write_text(json.dumps(load))
    sim = _cli("sim", "run", *common, "--out", str(simulated), "--num-kv-blocks", str(args.num_kv_blocks),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens),
               "--one-prompt-end-per-step")  # as the measured `tokenmill serve` schedules
    if args.profile:
        sim += ["--profile", args.profile]
    subprocess.run(sim, check=True, stdout=subprocess.DEVNULL)
    return _summary(measured), _summary(simulated), load if load else None


def error_rows(cases: list[tuple]) -> tuple[list[list[Any]], dict[str, list[float]]]:
    """cases: (workload, rate, measured summary, simulated summary[, (load before, load after)])."""
    from tokenmill.bench.compare import lookup
    rows, errors = [], {label: [] for _, label in METRICS}
    for workload, rate, meas, sim, *load in cases:
        row: list[Any] = [workload, f"{rate:g}", f"{load[0][0]:.1f} -> {load[0][1]:.1f}" if load and load[0] else "-"]
        for key, label in METRICS:
            m, s = lookup(meas, key), lookup(sim, key)
            if m and s is not None:
                err = (s - m) / m
                errors[label].append(abs(err))
                row.append(f"{m:.1f} / {s:.1f} ({100 * err:+.0f}%)")
            else:
                row.append("-")
        rows.append(row)
    return rows, errors


def error_table(cases: list[tuple]) -> str:
    rows, errors = error_rows(cases)
    header = ["Workload", "Rate (req/s)", "Load avg", *[f"{label} meas / sim" for _, label in METRICS]]
    summary = [[label, f"{100 * statistics.median(e):.1f}%" if e else "-", f"{100 * max(e):.1f}%" if e else "-"]
               for label, e in errors.items()]
    return (md_table(header, rows) + "\n\n" + md_table(["Metric", "Median |error|", "Worst |error|"], summary)
            + "\n\nTarget: median |error| <= 10%, worst <= 20%. TTFT/TPOT in ms, throughput in output tok/s.")


def run_validate(args: argparse.Namespace) -> int:
    from tokenmill.models.default_model import resolve_default_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(resolve_default_model())
    cases = []
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        if workload not in DEFAULT_CASES:
            raise ValueError(f"--workloads: {workload!r} is not one of {', '.join(DEFAULT_CASES)}")
        opts, rates = DEFAULT_CASES[workload]
        rates = [float(r) for r in args.rates.split(",")] if args.rates else rates
        port = free_port()
        server = None if args.sim_only else start_server(args, port, out / f"server-{workload}.log")
        try:
            for index, rate in enumerate(rates):
                meas, sim, load = run_case(args, workload, opts, rate, port, out, tokenizer, index)
                cases.append((workload, rate, meas, sim, load))
                print(f"{workload} rate {rate:g}: done", flush=True)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=60)
    table = error_table(cases)
    load = os.getloadavg()
    text = f"# tokenmill sim validate\n\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n\n{table}\n"
    (out / "validation.md").write_text(text, encoding="utf-8")
    print(text)
    return 0
