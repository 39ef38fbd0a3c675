"""`tokenmill serve` / `python -m tokenmill.server`: the uvicorn process and its signals.

    python -m tokenmill.server [MODEL] --host 127.0.0.1 --port 8000 [--api-key KEY] [engine flags]

Safe defaults: loopback only; with --api-key (or $TOKENMILL_API_KEY) every route but /health (and
/metrics with --public-metrics) needs `Authorization: Bearer KEY` (401); bodies over
--max-request-body-bytes get 413, headers over --max-request-header-bytes 431; CORS only for
--allowed-origins; prompts are logged only with --log-prompts; more than --max-waiting-requests waiting
requests get 429 with Retry-After; X-Request-Id is echoed (one is made up when absent). On SIGTERM
the server stops admitting (503), lets in-flight requests finish for --shutdown-timeout seconds,
aborts the rest with a final error message, and exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import uvicorn

from tokenmill import logger as tm_logger
from tokenmill.server import cli_args
from tokenmill.server.app import build_app
from tokenmill.server.listen import listen_socket
from tokenmill.server.state import ServerState

logger = logging.getLogger("tokenmill.server")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
SWITCH_INTERVAL_S = 0.0005


class _Server(uvicorn.Server):
    """uvicorn.Server that starts draining on the first SIGTERM/SIGINT and, unlike uvicorn, does
    not re-raise the signal after shutting down, so a SIGTERM ends the process with status 0."""

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[int], None]) -> None:
        super().__init__(config)
        self.on_signal = on_signal

    def handle_exit(self, sig: int, frame) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first:
            self.on_signal(sig)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in originals.items():
                signal.signal(s, handler)


def run_server(args: argparse.Namespace) -> int:
    """`tokenmill serve`: returns the process exit status (0 after SIGTERM or SIGINT, 1 if the model
    fails to load, 2 for bad flags, 3 (uvicorn's start-up failure) if the port cannot be bound)."""
    import prometheus_client

    from tokenmill.engine.engine import LLMEngine

    prometheus_client.disable_created_metrics()  # no *_created series: they only clutter /metrics
    level = getattr(args, "log_level", "info")
    tm_logger.set_level(level)
    try:
        config = cli_args.engine_config_from_args(args)
        chat_template = cli_args.load_chat_template(getattr(args, "chat_template", None))
    except (ValueError, OSError) as e:
        print(f"tokenmill serve: error: {e}", file=sys.stderr)
        return 2
    if args.host not in _LOOPBACK and not args.api_key:
        logger.warning("binding to %s without --api-key: anyone who can reach this address can use the server",
                       args.host)
    try:  # before the engine opens its side ports (KV connectors) and loads: a taken port fails at once
        sock = listen_socket(args.host, args.port)
    except OSError as e:
        print(f"tokenmill serve: error: {e}", file=sys.stderr)
        return 3
    # The engine thread and the HTTP event loop share the GIL: each time a model op returns, the
    # engine waits for the loop to give the GIL back, up to the switch interval (5 ms by default).
    # 0.5 ms measured 3-5% lower streaming TPOT at 16 streams (docs/BENCHMARKS.md).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if args.host in _LOOPBACK and "UCX_NET_DEVICES" not in os.environ:
        # a server on loopback keeps its KV transfers there too: NIXL's UCX otherwise listens on every
        # interface (set UCX_NET_DEVICES to choose others)
        os.environ["UCX_NET_DEVICES"] = "lo"
    app = build_app(lambda: LLMEngine(config), served_model_names=args.served_model_name, api_key=args.api_key,
                    max_waiting_requests=args.max_waiting_requests, price_per_hour=args.price_per_hour,
                    max_request_body_bytes=args.max_request_body_bytes, chat_template=chat_template,
                    shutdown_timeout=args.shutdown_timeout,
                    log_stats=not getattr(args, "disable_log_stats", False),
                    max_request_header_bytes=args.max_request_header_bytes, public_metrics=args.public_metrics,
                    allowed_origins=args.allowed_origins, log_prompts=args.log_prompts,
                    max_engine_restarts=args.max_engine_restarts, enable_sleep_mode=args.enable_sleep_mode)
    state: ServerState = app.state.tokenmill
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, log_level=level, lifespan="on",
                               log_config=tm_logger.uvicorn_log_config(level),
                               access_log=not getattr(args, "disable_access_log", False),
                               timeout_graceful_shutdown=args.shutdown_timeout + 5.0,
                               # h11 answers a plain 400 past its own limit: keep it well above ours (431)
                               h11_max_incomplete_event_size=max(4 * args.max_request_header_bytes, 256 << 10))
    server = _Server(uv_config, drain_on_signal(state.begin_drain))
    state.on_fatal = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=[sock])
    except SystemExit as e:  # uvicorn exits this way when the app fails to start
        return e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        return 130
    return exit_now_if_loading(state, 1 if state.load_error is not None else 0)


def exit_now_if_loading(state: ServerState, code: int) -> int:
    """`code`, or, when the model is still loading, the end of the process with it at once: the loader
    thread is inside torch's C++ code, and the interpreter's exit under it aborted the process
    ("terminate called without an active exception", status 134)."""
    if state.loader is not None and state.loader.is_alive():
        logger.info("stopped before the model finished loading")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def drain_on_signal(begin_drain: Callable[[], None]) -> Callable[[int], None]:
    """A SIGTERM/SIGINT handler that starts draining on the serving loop."""
    def on_signal(sig: int) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_soon_threadsafe(begin_drain)

    return on_signal


def main(argv: list[str] | None = None) -> int:
    return run_server(cli_args.make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
