"""`tokenmill serve-multi` / `python -m tokenmill.server.multi_launch`: one process, several models,
one awake at a time (multi_model.py).

    tokenmill serve-multi --model 'NAME=[MODEL] [tokenmill serve model/engine flags]' --model ... \\
        [--switch-quantum-s 2] [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--price-per-hour 1]

Each `--model` is a name (what requests put in `model`) and, after `=`, the `tokenmill serve`
arguments of that model alone: its folder (none: the built-in SmolLM2-135M-Instruct), engine flags
and --chat-template, checked by serve's own parser. Server flags are given once, outside.
"""
from __future__ import annotations

import argparse
import sys
import threading

if __name__ == "__main__":  # before the web stack loads: a re-executed process would load it twice
    from tokenmill.malloc import reexec_with_tcmalloc
    reexec_with_tcmalloc("serve-multi")

import uvicorn  # noqa: E402

from tokenmill import logger as tm_logger
from tokenmill.server import cli_args
from tokenmill.server.app import build_app
from tokenmill.server.launch import SWITCH_INTERVAL_S, _Server, drain_on_signal
from tokenmill.server.listen import listen_socket
from tokenmill.server.multi_args import make_parser
from tokenmill.server.multi_model import HostedModel, MultiModelApp

def build(args: argparse.Namespace) -> MultiModelApp:
    """The hosted apps (their engines load when the server starts) and the app in front."""
    from tokenmill.engine.engine import LLMEngine
    hosted = []
    serve_parser = cli_args.make_parser()
    one_at_a_time = threading.Lock()  # the models load one after the other (transformers' lazy imports race)

    def load(config):
        with one_at_a_time:
            return LLMEngine(config)

    for name, argv in args.models:
        try:
            margs = serve_parser.parse_args(argv)
        except SystemExit:
            raise ValueError(f"--model {name}: bad flags {argv}") from None
        config = cli_args.engine_config_from_args(margs)
        template = cli_args.load_chat_template(margs.chat_template)
        app = build_app(lambda config=config: load(config), served_model_names=[name], api_key=args.api_key,
                        price_per_hour=args.price_per_hour, chat_template=template,
                        log_stats=not (args.disable_log_stats or margs.disable_log_stats), public_metrics=args.public_metrics,
                        max_waiting_requests=margs.max_waiting_requests, max_engine_restarts=0)
        hosted.append(HostedModel(name, app, app.state.tokenmill))
    return MultiModelApp(hosted, api_key=args.api_key, quantum_s=args.switch_quantum_s,
                         public_metrics=args.public_metrics)


def run(args: argparse.Namespace) -> int:
    import prometheus_client
    prometheus_client.disable_created_metrics()
    tm_logger.set_level(args.log_level)
    try:
        app = build(args)
    except (ValueError, OSError) as e:
        print(f"tokenmill serve-multi: error: {e}", file=sys.stderr)
        return 2
    try:
        sock = listen_socket(args.host, args.port)
    except OSError as e:
        print(f"tokenmill serve-multi: error: {e}", file=sys.stderr)
        return 3
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            log_config=tm_logger.uvicorn_log_config(args.log_level),
                            access_log=not args.disable_access_log)
    server = _Server(config, drain_on_signal(app.begin_drain))
    try:
        server.run(sockets=[sock])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        return 130
    return 0 if app.ready else 1


def main(argv: list[str] | None = None) -> int:
    return run(make_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
