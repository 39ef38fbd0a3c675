"""Workload generators and arrival processes: statistics match their parameters (seeded).

Tolerances are stated per test; each is several standard errors of the estimate at the sample
size used, and the seeds make the tests deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tokenmill.bench.arrivals import arrival_offsets, trace_offsets
from tokenmill.bench.workloads import (
    WORDS,
    BenchError,
    PromptBuilder,
    load_trace,
    lognormal_lengths,
    make_workload,
    uniform_lengths,
)

WORD_BUILDER = PromptBuilder()


class CharTokenizer:
    """One token per character: a tokenizer whose token count differs from the word count."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


# ---------------------------------------------------------------- prompts


def test_word_prompts_have_requested_length() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 7, 300):
        text = WORD_BUILDER.text(n, rng)
        assert WORD_BUILDER.count(text) == n
        assert set(text.split()) <= set(WORDS)


def test_tokenizer_prompts_have_requested_token_count() -> None:
    b = PromptBuilder(CharTokenizer())
    rng = np.random.default_rng(0)
    for n in (1, 50, 333):
        assert len(CharTokenizer().encode(b.text(n, rng))) == n


def test_workloads_are_reproducible() -> None:
    a = make_workload("chat", 50, 7, WORD_BUILDER)
    b = make_workload("chat", 50, 7, WORD_BUILDER)
    c = make_workload("chat", 50, 8, WORD_BUILDER)
    assert a == b
    assert a != c


# ---------------------------------------------------------------- length statistics


def test_uniform_lengths_mean_and_range() -> None:
    x = uniform_lengths(100, 0.5, 100_000, np.random.default_rng(1))
    assert x.min() == 50 and x.max() == 150
    assert abs(x.mean() - 100) < 0.5  # standard error ~0.09


def test_lognormal_lengths_mean() -> None:
    x = lognormal_lengths(256, 1.0, 4, 4096, 100_000, np.random.default_rng(2))
    assert abs(x.mean() / 256 - 1) < 0.02  # standard error ~0.4%, clipping bias < 0.5%
    assert np.median(x) < x.mean()  # right-skewed, like conversation lengths


def test_random_workload_statistics() -> None:
    reqs = make_workload("random", 4000, 0, WORD_BUILDER, {"input_len": "40", "output_len": "20"})
    ins = np.array([r.input_len for r in reqs])
    outs = np.array([r.output_len for r in reqs])
    assert abs(ins.mean() - 40) < 0.5 and abs(outs.mean() - 20) < 0.3  # ~5 standard errors
    assert ins.min() >= 20 and ins.max() <= 60
    assert all(WORD_BUILDER.count(r.prompt) == r.input_len for r in reqs[:200])


def test_chat_workload_statistics() -> None:
    reqs = make_workload("chat", 4000, 0, WORD_BUILDER, {"input_len": "30", "output_len": "50"})
    ins = np.array([r.input_len for r in reqs])
    outs = np.array([r.output_len for r in reqs])
    assert abs(ins.mean() / 30 - 1) < 0.08  # standard error ~2% (minimum-length clip adds ~1%)
    assert abs(outs.mean() / 50 - 1) < 0.06
    assert cv(ins) > 0.8  # log-normal sigma=1: CV ~1.3


def test_long_short_mix_fraction() -> None:
    opts = {"short_input_len": "16", "long_input_len": "256", "long_fraction": "0.1"}
    reqs = make_workload("long-short-mix", 4000, 0, WORD_BUILDER, opts)
    long = np.array([r.input_len > 100 for r in reqs])
    assert abs(long.mean() - 0.1) < 0.015  # standard error ~0.005


def test_shared_prefix_groups() -> None:
    opts = {"num_groups": "4", "prefix_len": "30", "suffix_len": "5"}
    reqs = make_workload("shared-prefix", 40, 0, WORD_BUILDER, opts)
    groups: dict[int, list[str]] = {}
    for r in reqs:
        assert r.input_len == 35 == WORD_BUILDER.count(r.prompt)
        groups.setdefault(r.group, []).append(r.prompt)
    assert sorted(groups) == [0, 1, 2, 3]
    assert all(len(v) == 10 for v in groups.values())  # balanced
    prefixes = {g: {" ".join(p.split()[:30]) for p in ps} for g, ps in groups.items()}
    assert all(len(p) == 1 for p in prefixes.values())  # one shared prefix per group
    assert len({next(iter(p)) for p in prefixes.values()}) == 4  # distinct across groups
    assert len({r.prompt for r in reqs}) == 40  # unique suffixes


def test_reasoning_is_short_in_long_out() -> None:
    reqs = make_workload("reasoning", 500, 0, WORD_BUILDER)
    ins = np.mean([r.input_len for r in reqs])
    outs = np.mean([r.output_len for r in reqs])
    assert abs(ins - 64) < 2 and abs(outs - 2048) < 40 and outs > 10 * ins


def test_bad_workload_options() -> None:
    with pytest.raises(BenchError, match="no option"):
        make_workload("shared-prefix", 5, 0, WORD_BUILDER, {"input_len": "3"})
    with pytest.raises(BenchError, match="long_fraction"):
        make_workload("long-short-mix", 5, 0, WORD_BUILDER, {"long_fraction": "1.5"})
    with pytest.raises(BenchError, match="not a valid int"):
        make_workload("random", 5, 0, WORD_BUILDER, {"input_len": "x"})
    with pytest.raises(BenchError, match="unknown workload"):
        make_workload("no-such-thing", 5, 0, WORD_BUILDER)


# ---------------------------------------------------------------- arrivals


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 2.0])
def test_arrival_rate_and_burstiness(burstiness: float) -> None:
    t = arrival_offsets(50_001, 10.0, burstiness, np.random.default_rng(3))
    gaps = np.diff(t)
    assert t[0] == 0 and np.all(gaps >= 0)
    assert abs(len(gaps) / t[-1] / 10.0 - 1) < 0.03  # rate; standard error ~0.45% * CV
    assert abs(cv(gaps) / burstiness - 1) < 0.05  # CV of inter-arrival times


def test_arrival_special_cases() -> None:
    rng = np.random.default_rng(0)
    assert np.all(arrival_offsets(5, float("inf"), 1.0, rng) == 0)
    np.testing.assert_allclose(arrival_offsets(4, 2.0, 0.0, rng), [0, 0.5, 1.0, 1.5])
    assert len(arrival_offsets(0, 1.0, 1.0, rng)) == 0


# ---------------------------------------------------------------- traces


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_replay(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [
        json.dumps({"timestamp": 12.5, "input_len": 10, "output_len": 4}),
        json.dumps({"timestamp": 10.0, "text": "hello there world", "output_len": 3}),
        "",
        json.dumps({"timestamp": 11.0, "input_len": 2, "output_len": 1}),
    ])
    reqs = load_trace(path, WORD_BUILDER)
    np.testing.assert_allclose(trace_offsets(reqs), [0.0, 1.0, 2.5])
    assert [r.input_len for r in reqs] == [3, 2, 10]
    assert reqs[0].prompt == "hello there world"
    assert [r.output_len for r in reqs] == [3, 1, 4]
    assert len(make_workload(str(path), 2, 0, WORD_BUILDER)) == 2


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: invalid JSON"),
    ('{"timestamp": 1, "input_len": 3}', "line 2: field 'output_len'"),
    ('{"timestamp": 1, "output_len": 3}', "line 2: needs 'input_len' or 'text'"),
    ('{"timestamp": -1, "input_len": 3, "output_len": 3}', "line 2: field 'timestamp' must be >= 0"),
    ('{"timestamp": 1, "input_len": 2.5, "output_len": 3}', "line 2: field 'input_len'"),
    ("[1, 2]", "line 2: expected a JSON object"),
])
def test_malformed_trace(tmp_path: Path, line: str, message: str) -> None:
    good = json.dumps({"timestamp": 0, "input_len": 3, "output_len": 3})
    path = write_lines(tmp_path / "bad.jsonl", [good, line])
    with pytest.raises(BenchError, match=message.replace("(", r"\(")):
        load_trace(path, WORD_BUILDER)


def test_trace_text_may_hold_any_line_separator_but_newline(tmp_path: Path) -> None:
    """A JSON Lines file ends lines at \\n only: U+2028, U+0085 and \\r\\n-ended lines are read whole."""
    text = "first\u2028second\u0085third\u2029"
    path = tmp_path / "u.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "text": text, "output_len": 2}, ensure_ascii=False) + "\r\n"
                    + json.dumps({"timestamp": 1, "input_len": 2, "output_len": 1}) + "\r\n", encoding="utf-8")
    reqs = load_trace(path, WORD_BUILDER)
    assert [r.prompt for r in reqs][0] == text and len(reqs) == 2


def test_empty_trace(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no requests"):
        load_trace(write_lines(tmp_path / "e.jsonl", [""]), WORD_BUILDER)


def test_word_list_is_one_token_per_word_in_smollm2(request: pytest.FixtureRequest) -> None:
    """The fallback word list really is ~1 token per word for the default model's tokenizer."""
    try:
        tok = request.getfixturevalue("smollm2_tokenizer")
    except Exception as e:  # noqa: BLE001 - default model not installed here
        pytest.skip(f"default model tokenizer unavailable: {e}")
    assert [w for w in WORDS if len(tok.encode(" " + w, add_special_tokens=False)) != 1] == []
    text = WORD_BUILDER.text(1000, np.random.default_rng(0))
    assert len(tok.encode(text, add_special_tokens=False)) == 1000
    exact = PromptBuilder(tok)
    for r in make_workload("random", 20, 0, exact, {"input_len": "64"}):
        assert len(tok.encode(r.prompt, add_special_tokens=False)) == r.input_len


@pytest.mark.parametrize("name", ["random", "chat", "long-short-mix", "reasoning", "shared-prefix"])
def test_variants_keep_lengths_but_change_text(name: str) -> None:
    """The runs of a sweep get new prompt text (no prefix-cache carry-over), same lengths."""
    a = make_workload(name, 40, 3, WORD_BUILDER)
    b = make_workload(name, 40, 3, WORD_BUILDER, variant=1)
    assert b == make_workload(name, 40, 3, WORD_BUILDER, variant=1)
    assert sorted((r.input_len, r.output_len) for r in a) == sorted((r.input_len, r.output_len) for r in b)
    if name != "shared-prefix":
        assert [(r.input_len, r.output_len) for r in a] == [(r.input_len, r.output_len) for r in b]
        assert [len(r.prompt.split()) for r in b] == [r.input_len for r in b]
    assert not {r.prompt for r in a} & {r.prompt for r in b}
    assert not {r.prompt[:40] for r in a} & {r.prompt[:40] for r in b}


def test_workloads_do_not_share_prompt_text() -> None:
    """Two workloads from one seed must not repeat each other's prompts (the prefix cache would
    make the second look faster): their text comes from separate streams."""
    texts = {}
    for name in ("random", "chat", "long-short-mix", "reasoning"):
        texts[name] = {r.prompt[:60] for r in make_workload(name, 50, 0, WORD_BUILDER, {"output_len": "8"})}
    names = list(texts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not texts[a] & texts[b], (a, b)
