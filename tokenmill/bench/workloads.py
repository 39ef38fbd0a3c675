"""Benchmark workloads (seeded, reproducible) and request arrival processes.

A workload is a list of `BenchRequest`s: a text prompt, the number of output tokens to ask for
(`max_tokens`, sent with `ignore_eos` so the server generates exactly that many), and the prompt
length in tokens we expect the server to see.

Synthetic workloads (name -> parameters dataclass, every field overridable with
``--workload-opt key=value``):

- ``random``: input and output lengths uniform in ``[L*(1-range_ratio), L*(1+range_ratio)]``.
- ``chat``: log-normal input and output lengths (mean ``input_len``/``output_len``, shape
  ``*_sigma``), clipped to ``[min_len, max_*_len]``, like conversational traffic.
- ``long-short-mix``: a fraction ``long_fraction`` of long-context prompts among short ones.
- ``shared-prefix``: ``num_groups`` groups whose requests share a ``prefix_len``-token prefix
  (a system prompt or document) followed by a unique ``suffix_len``-token question.
- ``reasoning``: short prompts, long outputs.

Each workload's default SLOs (for goodput) are in `tokenmill.bench.slos.DEFAULT_SLOS`.

Any other workload name is read as a JSONL trace file: one object per line with ``timestamp``
(seconds), ``input_len`` or ``text``, and ``output_len``; optionally ``prefix_group`` (a string or
integer) with ``prefix_len``: lines of one group share their first ``prefix_len`` tokens.

Prompt text is built from a Hugging Face tokenizer when one is given (token counts are then exact
up to re-tokenisation at joins); otherwise from a fixed list of common English words that are one
token each (with their leading space) in GPT-2/Llama-style BPE vocabularies, so one word is about
one token.

Arrivals (`bench/arrivals.py`): Poisson at rate ``r`` when the burstiness (the coefficient of variation CV of the
inter-arrival times) is 1; otherwise gamma inter-arrival times with shape ``1/CV**2`` and mean
``1/r`` (CV < 1 is smoother than Poisson, CV > 1 burstier, CV = 0 a fixed interval).
An infinite rate sends everything at once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class BenchError(Exception):
    """A problem the user can fix (bad parameter, bad file, unreachable server): one line."""


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    input_len: int  # expected prompt length in tokens
    output_len: int  # max_tokens to request
    timestamp: float | None = None  # arrival offset from a trace, seconds
    group: int | None = None  # shared-prefix group id


# Common English words, each a single token (with its leading space) in GPT-2/Llama-style BPE
# vocabularies (checked against SmolLM2's tokenizer in tests/bench/test_bench_workloads.py).
WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    """the of and to in is was for on with as at by that from it his an are were which this be or
    has had not but first one their its new after who they have her she two been other when there
    all during into school time may years more most only over city some world would where later up
    such used many can state about national out known university united then made film team game
    year war three group part well number people him also since until both under second while
    around music best several however series house family show life through high area between
    major early each work name before including long four local against former same because north
    south west east public around played river street party member march small
    old side club back left power great just could end home did book being best day last what like
    water light open case point town good these very line place down large few general own good
    right based took held still our will man women men young set age main make way form using
    order""".split()
))


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class PromptBuilder:
    """Makes prompt text of a given length in tokens.

    With ``text_rng`` the words are drawn from it instead of the generator each call passes, so a
    workload keeps its lengths (drawn from that generator) but gets different text.
    """

    def __init__(self, tokenizer: Tokenizer | None = None, text_rng: np.random.Generator | None = None) -> None:
        self.tokenizer = tokenizer
        self.text_rng = text_rng

    def text(self, n_tokens: int, rng: np.random.Generator) -> str:
        rng = self.text_rng if self.text_rng is not None else rng
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=max(n_tokens, 1))]
        text = " ".join(words[:n_tokens])
        if self.tokenizer is None:
            return text
        return self._fit(text, n_tokens, rng)

    def _fit(self, text: str, n_tokens: int, rng: np.random.Generator) -> str:
        ids = self._encode(text)
        while len(ids) < n_tokens:  # tokenizer merged words: add more
            more = [WORDS[i] for i in rng.integers(0, len(WORDS), size=n_tokens - len(ids))]
            text = text + " " + " ".join(more)
            ids = self._encode(text)
        return self.tokenizer.decode(ids[:n_tokens])  # type: ignore[union-attr]

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self._encode(text))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))  # type: ignore[union-attr]


def load_tokenizer(path: str) -> Tokenizer:
    if not Path(path).is_dir():
        raise BenchError(f"tokenizer folder {path!r} not found")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any failure is a user-facing one-liner
        raise BenchError(f"cannot load tokenizer from {path!r}: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------- length distributions


def uniform_lengths(mean: int, range_ratio: float, n: int, rng: np.random.Generator) -> np.ndarray:
    lo = max(1, round(mean * (1 - range_ratio)))
    hi = max(lo, round(mean * (1 + range_ratio)))
    return rng.integers(lo, hi + 1, size=n)


def lognormal_lengths(
    mean: float, sigma: float, lo: int, hi: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    mu = math.log(mean) - sigma**2 / 2  # so that E[X] = mean before clipping
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=n)), lo, hi).astype(int)


# ---------------------------------------------------------------- workload parameters


@dataclass
class RandomParams:
    input_len: int = 512
    output_len: int = 128
    range_ratio: float = 0.5


@dataclass
class ChatParams:
    input_len: int = 256  # mean
    output_len: int = 192  # mean
    input_sigma: float = 1.0
    output_sigma: float = 0.8
    min_len: int = 4
    max_input_len: int = 4096
    max_output_len: int = 2048


@dataclass
class LongShortParams:
    short_input_len: int = 256
    long_input_len: int = 4096
    long_fraction: float = 0.1
    output_len: int = 128
    range_ratio: float = 0.25


@dataclass
class SharedPrefixParams:
    num_groups: int = 8
    prefix_len: int = 1024
    suffix_len: int = 128
    output_len: int = 128


@dataclass
class ReasoningParams:
    input_len: int = 64
    output_len: int = 2048
    range_ratio: float = 0.25


def check_params(params: Any) -> None:
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if f.name in ("range_ratio", "long_fraction"):
            if not 0 <= value <= 1:
                raise BenchError(f"workload option {f.name} must be in [0, 1], got {value}")
        elif f.name.endswith("_sigma"):
            if value < 0:
                raise BenchError(f"workload option {f.name} must be >= 0, got {value}")
        elif value <= 0:
            raise BenchError(f"workload option {f.name} must be > 0, got {value}")


# ---------------------------------------------------------------- generators


def _requests(
    builder: PromptBuilder, ins: np.ndarray, outs: np.ndarray, rng: np.random.Generator
) -> list[BenchRequest]:
    return [BenchRequest(builder.text(int(i), rng), int(i), int(o)) for i, o in zip(ins, outs)]


def random_requests(p: RandomParams, n: int, rng: np.random.Generator, b: PromptBuilder) -> list[BenchRequest]:
    ins = uniform_lengths(p.input_len, p.range_ratio, n, rng)
    outs = uniform_lengths(p.output_len, p.range_ratio, n, rng)
    return _requests(b, ins, outs, rng)


def chat_requests(p: ChatParams, n: int, rng: np.random.Generator, b: PromptBuilder) -> list[BenchRequest]:
    ins = lognormal_lengths(p.input_len, p.input_sigma, p.min_len, p.max_input_len, n, rng)
    outs = lognormal_lengths(p.output_len, p.output_sigma, p.min_len, p.max_output_len, n, rng)
    return _requests(b, ins, outs, rng)


def long_short_requests(
    p: LongShortParams, n: int, rng: np.random.Generator, b: PromptBuilder
) -> list[BenchRequest]:
    is_long = rng.random(n) < p.long_fraction
    short = uniform_lengths(p.short_input_len, p.range_ratio, n, rng)
    long = uniform_lengths(p.long_input_len, p.range_ratio, n, rng)
    ins = np.where(is_long, long, short)
    outs = uniform_lengths(p.output_len, p.range_ratio, n, rng)
    return _requests(b, ins, outs, rng)


def shared_prefix_requests(
    p: SharedPrefixParams, n: int, rng: np.random.Generator, b: PromptBuilder
) -> list[BenchRequest]:
    prefixes = [b.text(p.prefix_len, rng) for _ in range(p.num_groups)]
    groups = rng.permutation(np.arange(n) % p.num_groups)
    out = []
    for g in groups:
        prompt = prefixes[g] + " " + b.text(p.suffix_len, rng)
        out.append(BenchRequest(prompt, p.prefix_len + p.suffix_len, p.output_len, group=int(g)))
    return out


def reasoning_requests(
    p: ReasoningParams, n: int, rng: np.random.Generator, b: PromptBuilder
) -> list[BenchRequest]:
    ins = uniform_lengths(p.input_len, p.range_ratio, n, rng)
    outs = uniform_lengths(p.output_len, p.range_ratio, n, rng)
    return _requests(b, ins, outs, rng)


Generator = Callable[[Any, int, np.random.Generator, PromptBuilder], list[BenchRequest]]

# a new workload also needs its default SLOs in tokenmill.bench.slos.DEFAULT_SLOS
WORKLOADS: dict[str, tuple[type, Generator]] = {
    "random": (RandomParams, random_requests),
    "chat": (ChatParams, chat_requests),
    "long-short-mix": (LongShortParams, long_short_requests),
    "shared-prefix": (SharedPrefixParams, shared_prefix_requests),
    "reasoning": (ReasoningParams, reasoning_requests),
}


def make_params(name: str, opts: dict[str, str]) -> Any:
    cls = WORKLOADS[name][0]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, raw in opts.items():
        key = key.replace("-", "_")
        if key not in fields:
            raise BenchError(f"workload {name!r} has no option {key!r} (options: {', '.join(fields)})")
        typ = int if fields[key].type in (int, "int") else float
        try:
            kwargs[key] = typ(raw)
        except ValueError:
            raise BenchError(f"workload option {key}={raw!r} is not a valid {typ.__name__}") from None
    params = cls(**kwargs)
    check_params(params)
    return params


def make_workload(
    name: str, n: int | None, seed: int, builder: PromptBuilder, opts: dict[str, str] | None = None,
    variant: int = 0,
) -> list[BenchRequest]:
    """The requests of a named synthetic workload or a JSONL trace file (first n of it).

    Lengths and prompt text come from separate generators, both seeded from ``seed``; the text one
    also from the workload's name and ``variant``. So two workloads never share prompt text (one
    stream read at shifted offsets would repeat whole prompts, which a server's prefix cache then
    hits), and ``variant`` > 0 keeps the lengths (output lengths, timestamps) of variant 0 with new
    text, so that the runs of a sweep do not hit the prefix cache the previous run filled.
    (Shared-prefix groups stay shared within a variant; trace lines given as ``text`` stay as they are.)
    """
    opts = opts or {}
    text_seed = [seed, 3, variant, zlib.crc32(name.encode("utf-8"))]
    builder = PromptBuilder(builder.tokenizer, np.random.default_rng(text_seed))
    if name in WORKLOADS:
        params = make_params(name, opts)
        rng = np.random.default_rng([seed, 0])
        return WORKLOADS[name][1](params, n or 200, rng, builder)
    if opts:
        raise BenchError("--workload-opt/--input-len/--output-len apply to synthetic workloads only")
    if not Path(name).is_file():
        raise BenchError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)} or give a JSONL trace file")
    return load_trace(Path(name), builder)[:n]


# ---------------------------------------------------------------- traces


def _number(obj: dict, key: str, where: str, integer: bool) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BenchError(f"{where}: field {key!r} must be a number, got {value!r}")
    if integer and (value != int(value) or value <= 0):
        raise BenchError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
    if value < 0:
        raise BenchError(f"{where}: field {key!r} must be >= 0, got {value!r}")
    return value


def _trace_request(obj: Any, where: str, builder: PromptBuilder, rng: np.random.Generator) -> BenchRequest:
    if not isinstance(obj, dict):
        raise BenchError(f"{where}: expected a JSON object")
    ts = _number(obj, "timestamp", where, integer=False)
    out_len = int(_number(obj, "output_len", where, integer=True))
    text = obj.get("text")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise BenchError(f"{where}: field 'text' must be a non-empty string")
        return BenchRequest(text, builder.count(text), out_len, timestamp=float(ts))
    if "input_len" not in obj:
        raise BenchError(f"{where}: needs 'input_len' or 'text'")
    in_len = int(_number(obj, "input_len", where, integer=True))
    if "prefix_group" in obj:
        return _grouped_request(obj, where, builder, rng, in_len, out_len, float(ts))
    return BenchRequest(builder.text(in_len, rng), in_len, out_len, timestamp=float(ts))


def _grouped_request(obj: dict, where: str, builder: PromptBuilder, rng: np.random.Generator, in_len: int,
                     out_len: int, ts: float) -> BenchRequest:
    """A trace line whose first `prefix_len` tokens are shared by every line of its `prefix_group`
    (a system prompt, a document): the prefix text is drawn from the group's own seed."""
    group = obj["prefix_group"]
    if not isinstance(group, (str, int)) or isinstance(group, bool):
        raise BenchError(f"{where}: field 'prefix_group' must be a string or an integer, got {group!r}")
    prefix_len = int(_number(obj, "prefix_len", where, integer=True))
    if prefix_len > in_len:
        raise BenchError(f"{where}: prefix_len {prefix_len} exceeds input_len {in_len}")
    group_id = zlib.crc32(str(group).encode("utf-8"))
    prefix = PromptBuilder(builder.tokenizer).text(prefix_len, np.random.default_rng([7, group_id]))
    text = prefix if prefix_len == in_len else prefix + " " + builder.text(in_len - prefix_len, rng)
    return BenchRequest(text, in_len, out_len, timestamp=ts, group=group_id)


def load_trace(path: Path, builder: PromptBuilder, seed: int = 0) -> list[BenchRequest]:
    """Read a JSONL trace; timestamps become offsets from the earliest one, sorted."""
    rng = np.random.default_rng([seed, 2])
    reqs = []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # JSON Lines (splitlines also cuts at U+2028)
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read trace {path}: {e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"trace {path} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchError(f"{where}: invalid JSON ({e.msg})") from None
        reqs.append(_trace_request(obj, where, builder, rng))
    if not reqs:
        raise BenchError(f"trace {path} has no requests")
    reqs.sort(key=lambda r: r.timestamp)
    t0 = reqs[0].timestamp or 0.0
    return [dataclasses.replace(r, timestamp=(r.timestamp or 0.0) - t0) for r in reqs]
