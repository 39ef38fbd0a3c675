"""`tokenmill serve-multi`'s flags (multi_launch.py runs it), apart from the server code so that
building the CLI's parser imports no web framework."""
from __future__ import annotations

import argparse
import shlex

from tokenmill.server import cli_args

# flags of the whole process: refused inside a --model spec
SERVER_ONLY = ("--host", "--port", "--api-key", "--price-per-hour", "--served-model-name", "--enable-sleep-mode")


def model_spec(text: str) -> tuple[str, list[str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--model: expected NAME=[MODEL] [flags], got {text!r}")
    argv = shlex.split(rest)
    bad = [a for a in argv if a.split("=")[0] in SERVER_ONLY]
    if bad:
        raise argparse.ArgumentTypeError(f"--model {name}: {bad} are flags of the whole server, give them once "
                                         f"outside --model")
    return name.strip(), argv


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill serve-multi",
                                description="one server process holding several models, one awake at a time")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="models", type=model_spec, action="append", required=True,
                   metavar="NAME=[MODEL] [FLAGS]", help="a model to host (repeat; the first starts awake)")
    p.add_argument("--switch-quantum-s", type=cli_args.non_negative_float, default=2.0,
                   help="how long a request for a sleeping model waits before the awake model stops taking "
                        "new requests and drains (default: %(default)s)")
    p.add_argument("--host", default=cli_args.DEFAULT_HOST)
    p.add_argument("--port", type=cli_args._port, default=cli_args.DEFAULT_PORT)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (not on /health)")
    p.add_argument("--public-metrics", action="store_true", help="serve /metrics without the API key")
    p.add_argument("--price-per-hour", type=cli_args.non_negative_float, default=cli_args.DEFAULT_PRICE_PER_HOUR)
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--disable-access-log", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
