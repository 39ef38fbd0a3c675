"""Flags of `tokenmill serve` (names follow `vllm serve` where the concept is the same)."""
from __future__ import annotations

import argparse
import dataclasses

from tokenmill.config import ATTENTION_BACKENDS, DTYPES, KV_CACHE_DTYPES, EngineConfig

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_WAITING_REQUESTS = 256
# USD per hour of the machine serving. 1.0 is roughly an on-demand cloud VM with 16-32 vCPUs;
# set it to what you pay (e.g. ~3-4 for one H100 on demand) to read a meaningful
# tokenmill:cost_per_million_output_tokens_usd.
DEFAULT_PRICE_PER_HOUR = 1.0
DEFAULT_MAX_REQUEST_BODY_BYTES = 1 << 20  # 1 MiB: ~100k tokens of text or token ids per request
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0

_ENGINE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}

# EngineConfig field -> flag; every one defaults to EngineConfig's own default
ENGINE_FLAGS = ("dtype", "max_model_len", "block_size", "kv_cache_memory_gb", "num_kv_blocks", "kv_cache_dtype",
                "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs",
                "long_prefill_token_threshold", "attention_backend", "seed", "num_threads", "tokenizer")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def add_serve_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    d = _ENGINE_DEFAULTS
    parser.add_argument("model", nargs="?", default=None,
                        help="Hugging Face model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default=DEFAULT_HOST,
                     help="address to bind (default: %(default)s, loopback only; use 0.0.0.0 deliberately, "
                          "with --api-key)")
    srv.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port (default: %(default)s)")
    srv.add_argument("--api-key", default=None,
                     help="require 'Authorization: Bearer KEY' on every /v1 route (default: no auth)")
    srv.add_argument("--served-model-name", nargs="+", default=None,
                     help="model name(s) the API answers to; the first one is reported in responses "
                          "(default: the model folder's name, or SmolLM2-135M-Instruct)")
    srv.add_argument("--chat-template", default=None,
                     help="Jinja chat template, or a file holding one, for models whose tokenizer has none")
    srv.add_argument("--max-waiting-requests", type=_positive_int, default=DEFAULT_MAX_WAITING_REQUESTS,
                     help="requests allowed to wait for the engine; beyond it the server answers 429 with "
                          "Retry-After (default: %(default)s)")
    srv.add_argument("--max-request-body-bytes", type=_positive_int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                     help="larger request bodies get 413 (default: %(default)s)")
    srv.add_argument("--price-per-hour", type=_non_negative_float, default=DEFAULT_PRICE_PER_HOUR,
                     help="USD per hour of the device serving, used for "
                          "tokenmill:cost_per_million_output_tokens_usd = price_per_hour / 3600 * busy_s / "
                          "output_tokens * 1e6 over the last 60 s of busy time (default: %(default)s, "
                          "about an on-demand CPU VM)")
    srv.add_argument("--shutdown-timeout", type=_non_negative_float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                     help="on SIGTERM, seconds in-flight requests may take to finish before they are "
                          "aborted (default: %(default)s)")
    srv.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                     help="server log level (default: %(default)s)")
    srv.add_argument("--disable-access-log", action="store_true", help="do not log every HTTP request")

    eng = parser.add_argument_group("engine")
    eng.add_argument("--dtype", choices=DTYPES, default=d["dtype"],
                     help="weight and activation dtype (default: %(default)s)")
    eng.add_argument("--max-model-len", type=_positive_int, default=d["max_model_len"],
                     help="context length, prompt + output (default: the model's)")
    eng.add_argument("--block-size", type=int, default=d["block_size"],
                     help="tokens per KV cache block (default: %(default)s)")
    eng.add_argument("--kv-cache-memory-gb", type=float, default=d["kv_cache_memory_gb"],
                     help="KV cache budget in GiB (default: 10%% of available memory, within [0.25, 4])")
    eng.add_argument("--num-kv-blocks", type=_positive_int, default=d["num_kv_blocks"],
                     help="number of KV blocks, overriding the memory budget")
    eng.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=d["kv_cache_dtype"],
                     help="KV cache dtype (default: %(default)s)")
    eng.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                     default=d["enable_prefix_caching"], help="reuse KV blocks of shared prefixes (default: on)")
    eng.add_argument("--max-num-batched-tokens", type=_positive_int, default=d["max_num_batched_tokens"],
                     help="token budget of one engine step (default: %(default)s)")
    eng.add_argument("--max-num-seqs", type=_positive_int, default=d["max_num_seqs"],
                     help="sequences running at once (default: %(default)s)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=d["long_prefill_token_threshold"],
                     help="cap on one prompt's chunk per step, 0: none (default: %(default)s)")
    eng.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=d["attention_backend"],
                     help="attention implementation (default: %(default)s)")
    eng.add_argument("--seed", type=int, default=d["seed"], help="engine random seed (default: %(default)s)")
    eng.add_argument("--num-threads", type=_positive_int, default=d["num_threads"],
                     help="CPU threads for the model (default: all cores of this process)")
    eng.add_argument("--tokenizer", default=d["tokenizer"], help="tokenizer folder (default: the model's)")
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags (raises ValueError with a clear message)."""
    kwargs = {name: getattr(args, name) for name in ENGINE_FLAGS if hasattr(args, name)}
    names = getattr(args, "served_model_name", None)
    return EngineConfig(model=args.model, served_model_name=names[0] if names else None, **kwargs)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenmill serve",
                                     description="OpenAI-compatible server (completions, chat, /metrics)")
    return add_serve_args(parser)
