"""Engine flags shared by every command that builds an engine (serve, generate, chat); names
follow vLLM's where the concept is the same."""
from __future__ import annotations

import argparse
import json
import dataclasses
import re

from tokenmill.config import (ATTENTION_BACKENDS, DTYPES, KV_CACHE_DTYPES, KV_CONNECTORS, KV_ROLES, QUANTIZATIONS,
                              EngineConfig)

_ENGINE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}

# EngineConfig field -> flag; every one defaults to EngineConfig's own default
ENGINE_FLAGS = ("dtype", "max_model_len", "block_size", "kv_cache_memory_gb", "num_kv_blocks", "kv_cache_dtype",
                "kv_cache_prefault",
                "quantization", "quant_group_size",
                "enable_prefix_caching", "max_num_batched_tokens", "max_num_seqs",
                "long_prefill_token_threshold", "one_prompt_end_per_step", "attention_backend", "batch_invariant", "seed", "num_threads", "tokenizer",
                "speculative_config", "kv_role", "kv_transfer_timeout_s", "kv_connector")


def json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


MODEL_HELP = "Hugging Face model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)"


class _ModelAction(argparse.Action):
    """Stores the model from `MODEL` or `--model`; giving two different ones is an error."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is None:  # the optional positional, absent
            return
        current = getattr(namespace, self.dest, None)
        if current is not None and current != values:
            parser.error(f"the model is given twice ({current!r} and {values!r}); give MODEL or --model once")
        setattr(namespace, self.dest, values)


def add_model_args(parser: argparse.ArgumentParser, positional: bool = True) -> None:
    """The model, as `vllm serve MODEL`: an optional positional `MODEL` and `--model`, both into
    args.model. Commands whose positionals are something else (generate: prompts) take `--model` only."""
    if positional:
        parser.add_argument("model", nargs="?", default=None, action=_ModelAction, metavar="MODEL",
                            help=MODEL_HELP + "; same as --model")
    parser.add_argument("--model", dest="model", default=None, action=_ModelAction,
                        help=MODEL_HELP if not positional else "the model, instead of the positional MODEL")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    d = _ENGINE_DEFAULTS
    eng = parser.add_argument_group("engine")
    eng.add_argument("--dtype", choices=DTYPES, default=d["dtype"],
                     help="weight and activation dtype (default: %(default)s)")
    eng.add_argument("--max-model-len", type=positive_int, default=d["max_model_len"],
                     help="context length, prompt + output (default: the model's)")
    eng.add_argument("--block-size", type=int, default=d["block_size"],
                     help="tokens per KV cache block (default: %(default)s)")
    eng.add_argument("--kv-cache-memory-gb", type=float, default=d["kv_cache_memory_gb"],
                     help="KV cache budget in GiB (default: 10%% of available memory, within [0.25, 4])")
    eng.add_argument("--num-kv-blocks", type=positive_int, default=d["num_kv_blocks"],
                     help="number of KV blocks, overriding the memory budget")
    eng.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=d["kv_cache_dtype"],
                     help="KV cache dtype (default: %(default)s)")
    eng.add_argument("--quantization", "-q", choices=QUANTIZATIONS, default=d["quantization"],
                     help="weight format: gguf keeps a .gguf file's Q4_0/Q4_1/Q8_0 blocks and computes on them; "
                          "none dequantizes to --dtype; int8 (per output channel) / int4 (per group, see "
                          "--quant-group-size) quantize the linear layers at load, weight-only, round to nearest; "
                          "awq / gptq read folders those tools (or `tokenmill quantize`) wrote (default: gguf for "
                          "a .gguf model, the default model included; the folder's awq/gptq; else none)")
    eng.add_argument("--quant-group-size", type=int, choices=(32, 64, 128), default=d["quant_group_size"],
                     help="inputs per int4 scale (default: %(default)s)")
    eng.add_argument("--kv-cache-prefault", action=argparse.BooleanOptionalAction, default=d["kv_cache_prefault"],
                     help="map the whole KV cache at start (a few seconds), so no request pays a first-write page "
                          "fault (default: on for serve, off otherwise)")
    eng.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                     default=d["enable_prefix_caching"], help="reuse KV blocks of shared prefixes (default: on)")
    eng.add_argument("--max-num-batched-tokens", type=positive_int, default=d["max_num_batched_tokens"],
                     help="token budget of one engine step (default: %(default)s)")
    eng.add_argument("--max-num-seqs", type=positive_int, default=d["max_num_seqs"],
                     help="sequences running at once (default: %(default)s)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=d["long_prefill_token_threshold"],
                     help="cap on one prompt's chunk per step, 0: none (default: %(default)s)")
    eng.add_argument("--one-prompt-end-per-step", action=argparse.BooleanOptionalAction,
                     default=d["one_prompt_end_per_step"],
                     help="a step that ends a prompt takes no other prompt's chunk, so its first token is not held "
                          "back by a newcomer's prefill (default: on for serve, off otherwise)")
    eng.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=d["attention_backend"],
                     help="attention implementation (default: %(default)s)")
    eng.add_argument("--batch-invariant", action="store_true", default=d["batch_invariant"],
                     help="a sequence's output never depends on what it is batched with (and greedy speculative "
                          "decoding is token-identical in bfloat16 too); costs some speed: docs/BENCHMARKS.md")
    eng.add_argument("--seed", type=int, default=d["seed"], help="engine random seed (default: %(default)s)")
    eng.add_argument("--num-threads", type=positive_int, default=d["num_threads"],
                     help="CPU threads for the model (default: all cores of this process)")
    eng.add_argument("--tokenizer", default=d["tokenizer"], help="tokenizer folder (default: the model's)")
    eng.add_argument("--speculative-config", type=json_object, default=d["speculative_config"],
                     help='speculative decoding, as vLLM\'s: e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                          '"prompt_lookup_max": 5, "prompt_lookup_min": 2}\'; methods ngram, layer_skip '
                          '(+ "num_draft_layers"), draft_model (+ "model": an HF folder or .gguf) (default: off)')
    eng.add_argument("--role", dest="kv_role", choices=KV_ROLES, default=d["kv_role"],
                     help="prefill/decode disaggregation: prefill (shares its KV cache in shared memory and hands "
                          "requests' KV over), decode (loads KV handed over), both (neither: today's engine) "
                          "(default: %(default)s)")
    eng.add_argument("--kv-transfer-timeout", dest="kv_transfer_timeout_s", type=non_negative_float,
                     default=d["kv_transfer_timeout_s"],
                     help="role prefill: seconds a handed-over request's blocks stay held for the decode engine "
                          "before they are freed (default: %(default)s)")
    eng.add_argument("--kv-connector", choices=KV_CONNECTORS, default=d["kv_connector"],
                     help="how KV moves between prefill and decode engines: shm (shared memory, one machine), "
                          "nixl (NIXL over UCX, pull model; pip install 'tokenmill[nixl]') (default: %(default)s)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments from parsed flags (model excluded)."""
    return {name: getattr(args, name) for name in ENGINE_FLAGS if hasattr(args, name)}


ENGINE_FIELD_FLAGS = {name: "--" + name.replace("_", "-") for name in ENGINE_FLAGS}
ENGINE_FIELD_FLAGS.update(kv_role="--role", kv_transfer_timeout_s="--kv-transfer-timeout")


def name_the_flag(message: str, field_flags: dict[str, str]) -> str:
    """'max_tokens must be ...' -> '--max-tokens must be ...' (users know flags, not fields)."""
    m = re.match(r"(\w+) must", message)
    if m and m.group(1) in field_flags:
        return field_flags[m.group(1)] + message[len(m.group(1)):]
    return message


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags, validated before any model loads (ValueError naming the flag)."""
    try:
        return EngineConfig(model=args.model, **engine_kwargs(args))
    except ValueError as e:
        raise ValueError(name_the_flag(str(e), ENGINE_FIELD_FLAGS)) from None
