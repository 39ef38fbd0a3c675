"""`tokenmill fleet --config fleet.yaml` and `tokenmill ledger`."""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

logger = logging.getLogger("tokenmill.fleet")


def add_fleet_parser(sub) -> None:
    p = sub.add_parser("fleet", help="one OpenAI endpoint over pools of engines, routed by SLO class",
                       description="Start every pool's replicas (tokenmill serve processes on loopback, pinned "
                                   "to the pool's cores) and serve one OpenAI endpoint in front of them, with "
                                   "/metrics, a cost ledger and /dashboard. The config format: "
                                   "tokenmill/fleet/config.py.")
    p.add_argument("--config", required=True, help="fleet YAML file (pools, slo_classes, tenants)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--ledger", default=None, help="SQLite ledger file (default: the config's `ledger`)")
    p.add_argument("--log-dir", default=None, help="folder for the replicas' logs (default: a new temp folder)")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds replicas may take to start")
    p.set_defaults(func=run_fleet)


def run_fleet(args: argparse.Namespace) -> int:
    import uvicorn

    from tokenmill import logger as tm_logger
    from tokenmill.fleet.app import build_fleet_app
    from tokenmill.fleet.config import load_fleet_config
    from tokenmill.fleet.runtime import FleetRuntime
    from tokenmill.server.listen import listen_socket

    config = load_fleet_config(args.config)  # ValueError naming the field: one line, exit 2
    sock = listen_socket(args.host, args.port)  # held before the replicas take their free ports
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tokenmill-fleet-"))
    runtime = FleetRuntime(config, log_dir, args.ledger, ready_timeout=args.ready_timeout)
    logger.info("replica logs in %s; ledger %s", log_dir, runtime.ledger.path)
    app = build_fleet_app(runtime)
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_config=tm_logger.uvicorn_log_config("info"),
                               access_log=False, lifespan="on")
    uvicorn.Server(uv_config).run(sockets=[sock])
    return 0


def add_ledger_parser(sub) -> None:
    p = sub.add_parser("ledger", help="summarise a fleet's cost ledger over a period",
                       description="Totals of the append-only cost ledger: per model, pool, tenant and SLO "
                                   "class, $ per request and per 1M input / output tokens; per pool, "
                                   "utilization and idle cost.")
    p.add_argument("--ledger", default="tokenmill-ledger.sqlite", help="SQLite ledger file (default: %(default)s)")
    p.add_argument("--since", default=None, help="start: ISO time (UTC unless given), a span ago (30m, 2h, 1d) "
                                                 "or unix seconds (default: the beginning)")
    p.add_argument("--until", default=None, help="end, same forms (default: now)")
    p.add_argument("--by", default="model,pool,tenant,slo_class",
                   help="comma-separated grouping among model, pool, tenant, slo_class (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=run_ledger)


def run_ledger(args: argparse.Namespace) -> int:
    from tokenmill.fleet.ledger import connect
    from tokenmill.fleet.ledger_summary import (POOL_COLUMNS, REQUEST_COLUMNS, format_table, parse_time,
                                                pool_totals, request_totals)
    since, until = parse_time(args.since), parse_time(args.until)
    by = tuple(k for k in args.by.split(",") if k)
    conn = connect(args.ledger, readonly=True)
    try:
        requests, pools = request_totals(conn, by, since, until), pool_totals(conn, since, until)
    finally:
        conn.close()
    if args.json:
        print(json.dumps({"requests": requests, "pools": pools}, indent=1, default=str))
        return 0
    print(f"requests by {', '.join(by) or 'nothing (all)'}:")
    print(format_table(requests, list(by) + REQUEST_COLUMNS))
    print("\npools:")
    print(format_table(pools, POOL_COLUMNS))
    return 0
