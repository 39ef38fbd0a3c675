"""Disaggregation benchmark: colocated vs 1 prefill + 1 decode vs elastic, same cores, same router code.

    flock /tmp/tokenmill-bench.lock python -m tokenmill.bench.disagg --out out/disagg

Setups (each engine pinned to one core with sched_setaffinity, one model thread; the router is a
separate process on any core):
  colocated  2 engines --role both, `tokenmill router --both A B` (prefix-aware + load)
  1P+1D      --role prefill on core 0, --role decode on core 1, `tokenmill router --prefill P
             --decode D` (conditional disaggregation: uncached suffix >= --min-remote-prefill-tokens)
  elastic    `tokenmill cluster --engines 2 --prefill 1` (engine i on core i, the same router) with the
             profile planner (--planner-interval, patience 2, cooldown 2; TTFT/ITL targets = the SLO,
             the shipped CPU role profile): it may move an engine between the pools (or empty the
             prefill pool: colocated) between and during runs; role changes are counted per run
Workloads (the serving harness, `tokenmill bench serve`, against the router):
  long-short-mix  a quarter of prompts ~1536 tokens, the rest ~128; 64 output tokens
  bursty          ~512-token prompts, 64 output tokens, gamma arrivals with CV 4
each at the given request rates after a warm-up of 6 requests per workload. Every run has its own
seed (prompts and arrivals), so no run finds another's prompts in the prefix cache; both setups
get the same seeds. Per run: TTFT / TPOT p50 and p99, goodput under the SLO, failed
requests, and from the engines' /metrics the requests handed over, KV bytes and transfer time per
hand-over, recomputes, and the planner's role changes. Writes results.json and report.md into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ENGINE_ARGS = ["--kv-cache-memory-gb", "0.25", "--max-model-len", "4096", "--num-threads", "1",
               "--disable-log-stats", "--disable-access-log"]
WORKLOADS = {
    "long-short-mix": ["--workload", "long-short-mix", "--workload-opt", "short_input_len=128",
                       "--workload-opt", "long_input_len=1536", "--workload-opt", "long_fraction=0.25",
                       "--output-len", "64"],
    "bursty": ["--workload", "random", "--input-len", "512", "--output-len", "64", "--burstiness", "4"],
}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str], log: Path, core: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "wb")
        affinity = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        self.proc = subprocess.Popen([sys.executable, "-m", "tokenmill", *args, "--host", "127.0.0.1", "--port",
                                      str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=affinity)

    def wait(self, timeout: float = 300.0) -> Proc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log.name} exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.log.name} not healthy after {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in fam.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[key] = out.get(key, 0.0) + s.value
    return out


def delta(after: dict[str, float], before: dict[str, float], prefix: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))


class Engine:
    """An engine the elastic cluster started (the cluster process stops it)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stop(self) -> None:
        pass


def start_elastic(out: Path, min_remote: int, slo: tuple[int, int], interval_s: float) -> tuple[list[Engine], Proc]:
    first = free_port()
    while first + 1 >= 65535:
        first = free_port()
    args = ["cluster", "--engines", "2", "--prefill", "1", "--engine-args", " ".join(ENGINE_ARGS),
            "--first-engine-port", str(first), "--log-dir", str(out / "elastic_logs"), "--planner", "profile",
            "--planner-interval", str(interval_s), "--planner-patience", "2", "--planner-cooldown", "2",
            "--ttft-target-ms", str(slo[0]), "--itl-target-ms", str(slo[1]),
            "--min-remote-prefill-tokens", str(min_remote)]
    router = Proc(args, out / "elastic_cluster.log").wait()  # healthy once both engines are
    return [Engine(f"http://127.0.0.1:{first + i}") for i in (0, 1)], router


def start_setup(name: str, out: Path, min_remote: int, slo: tuple[int, int] = (2000, 100),
                interval_s: float = 2.0) -> tuple[list, Proc]:
    if name == "elastic":
        return start_elastic(out, min_remote, slo, interval_s)
    if name == "colocated":
        engines = [Proc(["serve", *ENGINE_ARGS], out / f"{name}_e{i}.log", core=i) for i in (0, 1)]
        roles = {"both": engines}
    else:
        engines = [Proc(["serve", *ENGINE_ARGS, "--role", "prefill"], out / f"{name}_prefill.log", core=0),
                   Proc(["serve", *ENGINE_ARGS, "--role", "decode"], out / f"{name}_decode.log", core=1)]
        roles = {"prefill": engines[:1], "decode": engines[1:]}
    for e in engines:
        e.wait()
    args = ["router", "--min-remote-prefill-tokens", str(min_remote)]
    for role, procs in roles.items():
        args += [f"--{role}", *[p.url for p in procs]]
    router = Proc(args, out / f"{name}_router.log").wait()
    return engines, router


def run_bench(router: Proc, workload: str, rate: float, n: int, seed: int, slo: tuple[int, int], out: Path) -> dict:
    cmd = [sys.executable, "-m", "tokenmill.bench.serve", "serve", "--base-url", router.url, *WORKLOADS[workload],
           "--num-requests", str(n), "--request-rate", str(rate), "--seed", str(seed), "--slo-ttft-ms",
           str(slo[0]), "--slo-tpot-ms", str(slo[1]), "--disable-tqdm", "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["summary"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenmill.bench.disagg", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/disagg"))
    ap.add_argument("--rates", default="1,2", help="request rates per second, comma-separated")
    ap.add_argument("--num-requests", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--min-remote-prefill-tokens", type=int, default=256)
    ap.add_argument("--slo-ttft-ms", type=int, default=2000)
    ap.add_argument("--slo-tpot-ms", type=int, default=100)
    ap.add_argument("--setups", default="colocated,1P+1D,elastic", help="comma-separated, of colocated, 1P+1D, "
                    "elastic (default: %(default)s)")
    ap.add_argument("--planner-interval", type=float, default=2.0, help="elastic: seconds between planner "
                    "decisions (default: %(default)s)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engines on the way out
    args.out.mkdir(parents=True, exist_ok=True)
    rates = [float(r) for r in args.rates.split(",")]
    setups = args.setups.split(",")
    bad = [s for s in setups if s not in ("colocated", "1P+1D", "elastic")]
    if bad:
        ap.error(f"--setups: unknown {bad}; allowed: colocated, 1P+1D, elastic")
    rows = []
    for setup in setups:
        engines, router = start_setup(setup, args.out, args.min_remote_prefill_tokens,
                                      (args.slo_ttft_ms, args.slo_tpot_ms), args.planner_interval)
        try:
            for workload in WORKLOADS:  # warm-up (first-use allocations, oneDNN primitives): not reported
                run_bench(router, workload, float("inf"), 6, 99, (args.slo_ttft_ms, args.slo_tpot_ms),
                          args.out / f"warmup_{setup}_{workload}".replace("+", ""))
            for rep in range(args.repeats):
                for wi, workload in enumerate(WORKLOADS):
                    for ri, rate in enumerate(rates):
                        before = {e.url: scrape(e.url) for e in engines} | {"router": scrape(router.url)}
                        tag = f"{setup}_{workload}_r{rate:g}_{rep}".replace("+", "")
                        s = run_bench(router, workload, rate, args.num_requests, 1 + 100 * wi + 10 * ri + rep, (args.slo_ttft_ms,
                                                                                      args.slo_tpot_ms),
                                      args.out / tag)
                        time.sleep(1.0)  # let held blocks be acked before reading the counters
                        after = {e.url: scrape(e.url) for e in engines} | {"router": scrape(router.url)}
                        rows.append(summarize_row(setup, workload, rate, rep, s, before, after, engines, router))
                        if setup == "elastic":  # why the planner did (not) move: its latest reason
                            rows[-1]["planner_last"] = httpx.get(router.url + "/router/planner", timeout=5).json()["last"]
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            router.stop()
            for e in engines:
                e.stop()
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    (args.out / "report.md").write_text(report(rows, args))
    print(report(rows, args))
    return 0


def summarize_row(setup, workload, rate, rep, s, before, after, engines, router) -> dict:
    kv_bytes = sum(delta(after[e.url], before[e.url], "tokenmill:kv_transfer_bytes_sum") for e in engines)
    kv_n = sum(delta(after[e.url], before[e.url], "tokenmill:kv_transfer_bytes_count") for e in engines)
    kv_s = sum(delta(after[e.url], before[e.url], "tokenmill:kv_transfer_seconds_sum") for e in engines)
    recompute = sum(delta(after[e.url], before[e.url], "tokenmill:kv_transfer_recomputes_total") for e in engines)
    held = sum(after[e.url].get("tokenmill:kv_cache_used_blocks", 0.0) for e in engines)
    g = s.get("goodput") or {}
    return {"setup": setup, "workload": workload, "rate": rate, "repeat": rep, "completed": s["completed"],
            "failed": s["failed"], "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p99_ms": s["tpot_ms"]["p99"],
            "goodput_rps": g.get("requests_per_s"), "attainment_pct": g.get("attainment_pct"),
            "throughput_rps": s["request_throughput"],
            "handed_over": kv_n, "kv_mib_per_handover": kv_bytes / kv_n / 2**20 if kv_n else None,
            "kv_ms_per_handover": 1000 * kv_s / kv_n if kv_n else None, "recomputes": recompute,
            "routed_local": delta(after["router"], before["router"], "tokenmill:router_requests_total|path=local"),
            "role_changes": delta(after["router"], before["router"], "tokenmill:planner_role_changes_total"),
            "pools_after": (f"{after['router'].get('tokenmill:planner_instances|role=prefill', 0):.0f}P+"
                            f"{after['router'].get('tokenmill:planner_instances|role=decode', 0):.0f}D"
                            if "tokenmill:planner_instances|role=prefill" in after["router"] else "-"),
            "blocks_held_after": held}


def report(rows: list[dict], args) -> str:
    head = ("| setup | workload | rate | rep | done/failed | TTFT p50 / p99 ms | TPOT p50 / p99 ms | goodput req/s "
            "(attain.) | handed over | KV MiB / ms per hand-over | role changes (pools after) | blocks held after |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    f = lambda v, p=0: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [f"SLO: TTFT <= {args.slo_ttft_ms} ms, TPOT <= {args.slo_tpot_ms} ms; {args.num_requests} requests per "
             f"run; min remote prefill {args.min_remote_prefill_tokens} tokens\n", head]
    notes = [f"- {r['workload']} rate {r['rate']:g} rep {r['repeat']}: {r['planner_last']}\n" for r in rows
             if r.get("planner_last")]
    for r in rows:
        lines.append(f"| {r['setup']} | {r['workload']} | {r['rate']:g} | {r['repeat']} | {r['completed']}/{r['failed']} "
                     f"| {f(r['ttft_p50_ms'])} / {f(r['ttft_p99_ms'])} | {f(r['tpot_p50_ms'], 1)} / "
                     f"{f(r['tpot_p99_ms'], 1)} | {f(r['goodput_rps'], 2)} ({f(r['attainment_pct'])}%) | "
                     f"{r['handed_over']:.0f} | {f(r['kv_mib_per_handover'], 1)} / {f(r['kv_ms_per_handover'], 1)} "
                     f"| {r['role_changes']:.0f} ({r['pools_after']}) | {r['blocks_held_after']:.0f} |\n")
    if notes:
        lines += ["\nThe elastic planner's latest decision after each run:\n", *notes]
    return "".join(lines)


if __name__ == "__main__":
    sys.exit(main())
