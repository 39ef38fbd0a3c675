"""`tokenmill router`'s flags; the router (router.py, with its web stack) loads only when it runs."""
from __future__ import annotations

from tokenmill.disagg.policy import RouterConfig


def add_router_parser(sub) -> None:
    p = sub.add_parser("router", help="KV-aware router with conditional prefill/decode disaggregation",
                       description="OpenAI API in front of prefill, decode and colocated (both) tokenmill engines.")
    p.add_argument("--prefill", nargs="*", default=[], metavar="URL", help="engines started with --role prefill")
    p.add_argument("--decode", nargs="*", default=[], metavar="URL", help="engines started with --role decode")
    p.add_argument("--both", nargs="*", default=[], metavar="URL", help="colocated engines (--role both)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    d = RouterConfig()
    p.add_argument("--min-remote-prefill-tokens", type=int, default=d.min_remote_prefill_tokens,
                   help="disaggregate only when the decode instance lacks at least this many prompt tokens "
                        "(default: %(default)s)")
    p.add_argument("--max-prefill-queue", type=int, default=d.max_prefill_queue,
                   help="a prefill instance with this many requests queued is skipped (default: %(default)s)")
    p.add_argument("--poll-interval", type=float, default=0.2, help="seconds between scrapes of each engine")
    p.set_defaults(func=_run_router)


def _run_router(args) -> int:
    import uvicorn

    from tokenmill.disagg.router import Router, build_router_app
    cfg = RouterConfig(min_remote_prefill_tokens=args.min_remote_prefill_tokens,
                       max_prefill_queue=args.max_prefill_queue)
    router = Router(args.prefill, args.decode, args.both, cfg, args.poll_interval)
    uvicorn.run(build_router_app(router), host=args.host, port=args.port, log_level="warning")
    return 0
