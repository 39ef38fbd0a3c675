"""`tokenmill cluster --engines N`: N engines on this machine, each pinned to its share of the
cores, behind the router with the elastic P:D planner.

Where the engines run is the launcher's business (launchers.py): processes on this machine
(`--launcher process`) or Ray actors on a Ray cluster's nodes (`--launcher ray`).

Every engine starts with `--role prefill` (its KV cache in shared memory), so it can send and
receive KV: its pool is the router's choice, and the planner moves engines between the prefill and
decode pools without restarting them: `--planner profile` (the default, disagg/sla_planner.py: replica
counts from a per-role profile and the observed load, corrected by measured latency) or `--planner
queue` (disagg/planner.py: queue pressure). On Ray the engines move KV
with NIXL unless --engine-args names another --kv-connector. Engine logs go to --log-dir.
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

from tokenmill.disagg.planner import PlannerConfig
from tokenmill.disagg.policy import RouterConfig
from tokenmill.disagg.sla_planner import SLAPlannerConfig


def core_shares(cores: list[int], n: int) -> list[list[int]]:
    """Engine i's cores: an equal share each when there are enough cores, else round robin."""
    if n <= len(cores):
        share = len(cores) // n
        return [cores[i * share:(i + 1) * share] for i in range(n)]
    return [[cores[i % len(cores)]] for i in range(n)]


def add_cluster_parser(sub) -> None:
    p = sub.add_parser("cluster", help="N engines on this machine behind the router, with the elastic P:D planner")
    p.add_argument("--engines", type=int, default=2, help="engines to start (default: %(default)s)")
    p.add_argument("--prefill", type=int, default=1, help="engines in the prefill pool at start; 0: all colocated "
                                                          "(profile planner only) (default: %(default)s)")
    p.add_argument("--model", default=None, help="model for every engine (default: the embedded one)")
    p.add_argument("--engine-args", default="", help="more `tokenmill serve` flags for every engine, one string")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--first-engine-port", type=int, default=8101)
    p.add_argument("--launcher", choices=("process", "ray"), default="process",
                   help="process: engines are processes here, pinned to cores; ray: Ray actors on the Ray "
                        "cluster's nodes (extra tokenmill[ray]) (default: %(default)s)")
    p.add_argument("--ray-address", default=None, help="the Ray cluster to join (default: RAY_ADDRESS or a "
                                                       "local `ray start` head)")
    p.add_argument("--ray-node-resources", nargs="*", default=[], metavar="RESOURCE",
                   help="custom Ray resources naming nodes: engine i runs on a node with RESOURCE[i %% n] "
                        "(default: anywhere Ray finds CPUs)")
    p.add_argument("--ray-num-cpus", type=float, default=1.0, help="CPUs each engine actor reserves (default: "
                                                                   "%(default)s)")
    p.add_argument("--log-dir", type=Path, default=Path("out/cluster"))
    p.add_argument("--min-remote-prefill-tokens", type=int, default=RouterConfig().min_remote_prefill_tokens)
    p.add_argument("--planner-interval", type=float, default=PlannerConfig().interval_s,
                   help="seconds between planner decisions (default: %(default)s)")
    p.add_argument("--no-planner", action="store_true", help="keep the pools as started")
    sla = SLAPlannerConfig()
    p.add_argument("--planner", choices=("profile", "queue"), default="profile",
                   help="profile: size the pools from a per-role profile and the load the router sees, corrected by "
                        "measured/expected latency; queue: move towards the pool with the longer queues "
                        "(default: %(default)s)")
    p.add_argument("--planner-profile", type=Path, default=None,
                   help="profile planner: a role profile JSON (python -m tokenmill.disagg.role_profile) or a "
                        "`tokenmill sim profile` JSON (default: the shipped CPU profile)")
    p.add_argument("--ttft-target-ms", type=float, default=sla.ttft_target_s * 1e3, help="profile planner's TTFT "
                   "target (default: %(default)s)")
    p.add_argument("--itl-target-ms", type=float, default=sla.itl_target_s * 1e3, help="profile planner's ITL "
                   "target (default: %(default)s)")
    p.add_argument("--min-prefill", type=int, default=sla.min_prefill,
                   help="profile planner: the smallest prefill pool; 0 lets it empty when prefill demand is small "
                        "(default: %(default)s)")
    p.add_argument("--planner-patience", type=int, default=sla.patience,
                   help="intervals asking for the same move before it is made (default: %(default)s)")
    p.add_argument("--planner-cooldown", type=int, default=sla.cooldown,
                   help="intervals after a move without another (default: %(default)s)")
    p.set_defaults(func=run_cluster)


def _check(args) -> None:
    if args.engines < 2:
        raise ValueError(f"--engines must be >= 2 (one prefill, one decode), got {args.engines}")
    low = 0 if args.planner == "profile" else 1
    if not low <= args.prefill < args.engines:
        raise ValueError(f"--prefill must be in [{low}, {args.engines - 1}] with --planner {args.planner}, "
                         f"got {args.prefill}")


def planner_config(args) -> PlannerConfig | SLAPlannerConfig:
    if args.planner == "queue":
        return PlannerConfig(interval_s=args.planner_interval, patience=args.planner_patience,
                             cooldown=args.planner_cooldown)
    return SLAPlannerConfig(interval_s=args.planner_interval, ttft_target_s=args.ttft_target_ms / 1e3,
                            itl_target_s=args.itl_target_ms / 1e3, min_prefill=args.min_prefill,
                            patience=args.planner_patience, cooldown=args.planner_cooldown)


def run_cluster(args) -> int:
    _check(args)
    import uvicorn

    from tokenmill.disagg.role_profile import describe, load_role_profile
    cfg = planner_config(args)  # bad settings fail before any engine starts
    profile = load_role_profile(args.planner_profile) if isinstance(cfg, SLAPlannerConfig) else None
    if profile is not None:
        print(describe(profile, cfg.ttft_target_s, cfg.itl_target_s), flush=True)

    from tokenmill.disagg.launchers import make_launcher
    from tokenmill.disagg.router import Router, build_router_app
    from tokenmill.server.listen import listen_socket
    sock = listen_socket(args.host, args.port)  # held before the engines take their free ports
    args.log_dir.mkdir(parents=True, exist_ok=True)
    shares = core_shares(sorted(os.sched_getaffinity(0)), args.engines)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    launcher = make_launcher(args)
    try:
        engine = [*([args.model] if args.model else []), "--role", "prefill", *shlex.split(args.engine_args)]
        if args.launcher == "ray" and "--kv-connector" not in engine:
            engine += ["--kv-connector", "nixl"]  # shared memory does not cross machines
        urls = [launcher.start(i, engine, cores) for i, cores in enumerate(shares)]
        launcher.wait_ready()
        router = Router(urls[:args.prefill], urls[args.prefill:], [],
                        RouterConfig(min_remote_prefill_tokens=args.min_remote_prefill_tokens))
        if not args.no_planner:
            router.enable_planner(cfg, profile)
        print(f"router on http://{args.host}:{args.port}: {args.prefill} prefill, "
              f"{args.engines - args.prefill} decode; planner {'off' if args.no_planner else args.planner}", flush=True)
        config = uvicorn.Config(build_router_app(router), host=args.host, port=args.port, log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        launcher.stop()
    return 0
