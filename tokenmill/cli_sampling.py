"""Sampling flags of `tokenmill generate` and `tokenmill chat` (the SamplingParams fields, named as
vLLM's), and the defaults they fall back to.

A flag the user does not give stays None, so defaults come in layers, the later winning:
SamplingParams' own, the command's base (max_tokens), then the model folder's
generation_config.json when it sets any sampling key (as vLLM) or else the command's fallback,
then the flags given.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill.engine.arg_utils import name_the_flag
from tokenmill.engine.generation_config import GENERATION_CONFIG_FILE, SAMPLING_FIELDS, load_generation_config
from tokenmill.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingFlag:
    flag: str
    param: str  # the SamplingParams field
    type: type
    help: str

    @property
    def dest(self) -> str:
        """The args attribute: the field, except seed (args.seed is the engine's --seed)."""
        return "sampling_seed" if self.param == "seed" else self.param


SAMPLING_FLAGS: tuple[SamplingFlag, ...] = (
    SamplingFlag("--temperature", "temperature", float, "randomness, 0: greedy; in [0, 100]"),
    SamplingFlag("--top-p", "top_p", float, "sample from the smallest token set holding this probability; (0, 1]"),
    SamplingFlag("--top-k", "top_k", int, "sample from the k most likely tokens; 0 or -1: all"),
    SamplingFlag("--min-p", "min_p", float, "drop tokens below min_p times the top token's probability; [0, 1]"),
    SamplingFlag("--repetition-penalty", "repetition_penalty", float,
                 "> 1 discourages tokens already in the prompt or output; (0, 10], 1: off"),
    SamplingFlag("--presence-penalty", "presence_penalty", float,
                 "penalty on tokens already generated; [-2, 2], 0: off"),
    SamplingFlag("--frequency-penalty", "frequency_penalty", float,
                 "penalty growing with each token's count in the output; [-2, 2], 0: off"),
    SamplingFlag("--max-tokens", "max_tokens", int, "most tokens to generate per output"),
    SamplingFlag("--min-tokens", "min_tokens", int, "tokens generated before EOS or a stop string may end the output"),
    SamplingFlag("--sampling-seed", "seed", int,
                 "per-request sampling seed (reproducible samples; --seed is the engine's own RNG seed)"),
)
_MULTI_OUTPUT_FLAGS: tuple[SamplingFlag, ...] = (
    SamplingFlag("--n", "n", int, "outputs per prompt"),
    SamplingFlag("--logprobs", "logprobs", int, "print each token's log probability and this many alternatives; 0..20"),
)
FIELD_FLAGS: dict[str, str] = {f.param: f.flag for f in SAMPLING_FLAGS + _MULTI_OUTPUT_FLAGS}
FIELD_FLAGS.update(stop="--stop", ignore_eos="--ignore-eos")
_FIELD_DESTS: dict[str, str] = {f.param: f.dest for f in SAMPLING_FLAGS + _MULTI_OUTPUT_FLAGS}
_FIELD_DESTS.update(stop="stop", ignore_eos="ignore_eos")
_PARAMS_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(SamplingParams) if f.init}


@dataclass(frozen=True)
class SamplingDefaults:
    """A command's defaults: `base` always applies; `fallback` only when the model's
    generation_config.json sets no sampling key."""
    base: dict[str, Any] = field(default_factory=dict)
    fallback: dict[str, Any] = field(default_factory=dict)
    fallback_name: str = "tokenmill defaults"


GENERATE_DEFAULTS = SamplingDefaults({"max_tokens": 128}, {"temperature": 0.0}, "greedy")
# Small instruct models loop under greedy decoding; these keep replies varied and on topic.
# max_tokens None: the room left in the context.
CHAT_DEFAULTS = SamplingDefaults({"max_tokens": None},
                                 {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1},
                                 "tokenmill chat defaults")


def add_sampling_args(parser: argparse.ArgumentParser, defaults: SamplingDefaults,
                      multi_output: bool = True) -> None:
    """The sampling flags; multi_output adds --n and --logprobs (generate, not chat)."""
    grp = parser.add_argument_group(
        "sampling", f"defaults marked 'model' come from the model folder's {GENERATION_CONFIG_FILE} when it "
                    "sets any of temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens (as vLLM)")
    flags = SAMPLING_FLAGS + (_MULTI_OUTPUT_FLAGS if multi_output else ())
    for f in flags:
        grp.add_argument(f.flag, dest=f.dest, type=f.type, default=None, metavar=f.type.__name__.upper(),
                         help=f"{f.help} (default: {_default_text(f.param, defaults)})")
    grp.add_argument("--stop", dest="stop", action="append", default=None, metavar="TEXT",
                     help="stop when this string is generated (not shown); repeat for several")
    grp.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=None,
                     help="keep generating past the end-of-sequence token")


def _default_text(name: str, defaults: SamplingDefaults) -> str:
    value = {**_PARAMS_DEFAULTS, **defaults.base, **defaults.fallback}[name]
    if value is None:
        text = {"max_tokens": "the room left in the context", "seed": "none, random"}.get(name, "off")
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"model, else {text}" if name in SAMPLING_FIELDS else text


def user_sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags the user gave, as SamplingParams keyword arguments."""
    given = {name: getattr(args, dest, None) for name, dest in _FIELD_DESTS.items()}
    return {name: value for name, value in given.items() if value is not None}


def check_sampling_args(args: argparse.Namespace, defaults: SamplingDefaults) -> None:
    """Fail fast, before any model loads, on flags SamplingParams refuses (ValueError naming the flag)."""
    build_sampling_params({**defaults.base, **defaults.fallback}, user_sampling_kwargs(args))


def resolve_sampling(args: argparse.Namespace, defaults: SamplingDefaults,
                     model_path: str | Path | None) -> tuple[SamplingParams, str]:
    """SamplingParams for the loaded model, and where its defaults came from (for the user)."""
    from_model = load_generation_config(model_path)
    layer = from_model or defaults.fallback
    source = f"the model's {GENERATION_CONFIG_FILE}" if from_model else defaults.fallback_name
    return build_sampling_params({**defaults.base, **layer}, user_sampling_kwargs(args)), source


def build_sampling_params(defaults: dict[str, Any], user: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**{**defaults, **user})
    except ValueError as e:
        raise ValueError(name_the_flag(str(e), FIELD_FLAGS)) from None


def describe(params: SamplingParams) -> str:
    """The sampling settings that matter, in one short line."""
    if params.greedy:
        parts = ["greedy"]
    else:
        parts = [f"temperature {params.temperature:g}"]
        parts += [f"top_p {params.top_p:g}"] if params.top_p < 1.0 else []
        parts += [f"top_k {params.top_k}"] if params.top_k else []
        parts += [f"min_p {params.min_p:g}"] if params.min_p else []
    parts += [f"repetition_penalty {params.repetition_penalty:g}"] if params.repetition_penalty != 1.0 else []
    parts += [f"max_tokens {params.max_tokens}"] if params.max_tokens is not None else []
    return ", ".join(parts)
