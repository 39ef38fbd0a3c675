"""Flags of `tokenmill serve` (names follow `vllm serve` where the concept is the same)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from tokenmill.config import EngineConfig
from tokenmill.engine.arg_utils import add_engine_args, add_model_args, engine_kwargs, non_negative_float, positive_int

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_WAITING_REQUESTS = 256
# USD per hour of the machine serving. 1.0 is roughly an on-demand cloud VM with 16-32 vCPUs;
# set it to what you pay (e.g. ~3-4 for one H100 on demand) to read a meaningful
# tokenmill:cost_per_million_output_tokens_usd.
DEFAULT_PRICE_PER_HOUR = 1.0
DEFAULT_MAX_REQUEST_BODY_BYTES = 1 << 20  # 1 MiB: ~100k tokens of text or token ids per request
DEFAULT_MAX_REQUEST_HEADER_BYTES = 16 << 10  # 16 KiB of request line + headers, h11's own default
API_KEY_ENV = "TOKENMILL_API_KEY"  # the --api-key default (keeps the key out of `ps`)
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
DEFAULT_MAX_ENGINE_RESTARTS = 3

def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_model_args(parser)
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default=DEFAULT_HOST,
                     help="address to bind (default: %(default)s, loopback only; use 0.0.0.0 deliberately, "
                          "with --api-key)")
    srv.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default: %(default)s)")
    srv.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                     help=f"require 'Authorization: Bearer KEY' on every route but /health (and /metrics with "
                          f"--public-metrics); default: ${API_KEY_ENV}, else no auth")
    srv.add_argument("--public-metrics", action="store_true",
                     help="serve /metrics without the API key (for a scraper on a trusted network)")
    srv.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                     help="origins browsers may call the API from (CORS), e.g. https://app.example.com; "
                          "default: none (CORS off)")
    srv.add_argument("--log-prompts", action="store_true",
                     help="log each request's prompt and sampling parameters (default: prompts never reach "
                          "the log)")
    srv.add_argument("--served-model-name", nargs="+", default=None,
                     help="model name(s) the API answers to; the first one is reported in responses "
                          "(default: the model folder's name, or SmolLM2-135M-Instruct)")
    srv.add_argument("--chat-template", default=None,
                     help="Jinja chat template, or a file holding one, for models whose tokenizer has none")
    srv.add_argument("--max-waiting-requests", type=positive_int, default=DEFAULT_MAX_WAITING_REQUESTS,
                     help="requests allowed to wait for the engine; beyond it the server answers 429 with "
                          "Retry-After (default: %(default)s)")
    srv.add_argument("--max-request-body-bytes", type=positive_int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                     help="larger request bodies get 413 (default: %(default)s)")
    srv.add_argument("--max-request-header-bytes", type=positive_int, default=DEFAULT_MAX_REQUEST_HEADER_BYTES,
                     help="a request line plus headers larger than this gets 431 (default: %(default)s)")
    srv.add_argument("--price-per-hour", type=non_negative_float, default=DEFAULT_PRICE_PER_HOUR,
                     help="USD per hour of the device serving, used for "
                          "tokenmill:cost_per_million_output_tokens_usd = price_per_hour / 3600 * busy_s / "
                          "output_tokens * 1e6 over the last 60 s of busy time (default: %(default)s, "
                          "about an on-demand CPU VM)")
    srv.add_argument("--shutdown-timeout", type=non_negative_float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                     help="on SIGTERM, seconds in-flight requests may take to finish before they are "
                          "aborted (default: %(default)s)")
    srv.add_argument("--max-engine-restarts", type=int, default=DEFAULT_MAX_ENGINE_RESTARTS,
                     help="if the engine loop dies, fail its in-flight requests (503 engine_dead) and build a fresh "
                          "engine, at most this many times; then /health stays 503 (default: %(default)s)")
    srv.add_argument("--enable-sleep-mode", action="store_true",
                     help="serve POST /sleep, POST /wake_up and GET /is_sleeping (vLLM's sleep mode: the KV cache "
                          "released, weights kept), for a fleet switching models on one device")
    srv.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                     help="server log level (default: %(default)s)")
    srv.add_argument("--disable-access-log", action="store_true", help="do not log every HTTP request")
    srv.add_argument("--disable-log-stats", action="store_true",
                     help="no periodic line (throughput, running/waiting requests, KV usage, prefix hit rate)")

    add_engine_args(parser)
    parser.set_defaults(kv_cache_prefault=True)  # a server keeps its cache: map it once, not mid-request
    parser.set_defaults(one_prompt_end_per_step=True)  # a server is judged on TTFT
    # vLLM's budget for its CPU API server (2048; 1024 stays for LLM): under load the larger steps give
    # waiting prompts more of each step (docs/BENCHMARKS.md, session 31: TTFT p99 lower on the long/short
    # mix in both runs, on chat in one, equal in the other)
    parser.set_defaults(max_num_batched_tokens=2048)
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags (raises ValueError with a clear message)."""
    names = getattr(args, "served_model_name", None)
    return EngineConfig(model=args.model, served_model_name=names[0] if names else None,
                        **engine_kwargs(args))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill serve",
                                     description="OpenAI-compatible server (completions, chat, /metrics)")
    return add_serve_args(parser)


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file holding a Jinja template, or the template itself."""
    if value is None:
        return None
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    if "{" not in value:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")
    return value
