"""`tokenmill cluster --engines N`: N engines on this machine, each pinned to its share of the
cores, behind the router with the elastic P:D planner.

Every engine starts with `--role prefill` (its KV cache in shared memory), so it can send and
receive KV: its pool is the router's choice, and the planner moves engines between the prefill and
decode pools without restarting them (tokenmill/disagg/planner.py). Engine logs go to --log-dir.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tokenmill.disagg.planner import PlannerConfig
from tokenmill.disagg.policy import RouterConfig


def core_shares(cores: list[int], n: int) -> list[list[int]]:
    """Engine i's cores: an equal share each when there are enough cores, else round robin."""
    if n <= len(cores):
        share = len(cores) // n
        return [cores[i * share:(i + 1) * share] for i in range(n)]
    return [[cores[i % len(cores)]] for i in range(n)]


def add_cluster_parser(sub) -> None:
    p = sub.add_parser("cluster", help="N engines on this machine behind the router, with the elastic P:D planner")
    p.add_argument("--engines", type=int, default=2, help="engines to start (default: %(default)s)")
    p.add_argument("--prefill", type=int, default=1, help="engines in the prefill pool at start (default: %(default)s)")
    p.add_argument("--model", default=None, help="model for every engine (default: the embedded one)")
    p.add_argument("--engine-args", default="", help="more `tokenmill serve` flags for every engine, one string")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--first-engine-port", type=int, default=8101)
    p.add_argument("--log-dir", type=Path, default=Path("out/cluster"))
    p.add_argument("--min-remote-prefill-tokens", type=int, default=RouterConfig().min_remote_prefill_tokens)
    p.add_argument("--planner-interval", type=float, default=PlannerConfig().interval_s,
                   help="seconds between planner decisions (default: %(default)s)")
    p.add_argument("--no-planner", action="store_true", help="keep the pools as started")
    p.set_defaults(func=run_cluster)


def _check(args) -> None:
    if args.engines < 2:
        raise ValueError(f"--engines must be >= 2 (one prefill, one decode), got {args.engines}")
    if not 1 <= args.prefill < args.engines:
        raise ValueError(f"--prefill must be in [1, {args.engines - 1}], got {args.prefill}")


def run_cluster(args) -> int:
    _check(args)
    import uvicorn

    from tokenmill.disagg.router import Router, build_router_app
    args.log_dir.mkdir(parents=True, exist_ok=True)
    shares = core_shares(sorted(os.sched_getaffinity(0)), args.engines)
    procs, urls = [], []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for i, cores in enumerate(shares):
            port = args.first_engine_port + i
            cmd = [sys.executable, "-m", "tokenmill", "serve", *([args.model] if args.model else []), "--role",
                   "prefill", "--num-threads", str(len(cores)), "--host", "127.0.0.1", "--port", str(port),
                   *shlex.split(args.engine_args)]
            log = open(args.log_dir / f"engine{i}.log", "wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=lambda c=cores: os.sched_setaffinity(0, set(c))))
            urls.append(f"http://127.0.0.1:{port}")
            print(f"engine {i}: {urls[-1]} on cores {cores} (log {log.name})", flush=True)
        for url, proc in zip(urls, procs):
            _wait(url, proc)
        router = Router(urls[:args.prefill], urls[args.prefill:], [],
                        RouterConfig(min_remote_prefill_tokens=args.min_remote_prefill_tokens))
        if not args.no_planner:
            router.enable_planner(PlannerConfig(interval_s=args.planner_interval))
        print(f"router on http://{args.host}:{args.port}: {args.prefill} prefill, "
              f"{args.engines - args.prefill} decode; planner {'off' if args.no_planner else 'on'}", flush=True)
        uvicorn.run(build_router_app(router), host=args.host, port=args.port, log_level="warning")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


def _wait(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OSError(f"engine {url} exited with {proc.returncode} (see its log)")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise OSError(f"engine {url} not healthy after {timeout:.0f} s")
