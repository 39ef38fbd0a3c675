"""Structured outputs inside the engine (tiny random model: the grammar, not the model, decides
validity): constrained rows obey their grammar, unconstrained rows in the same batch are untouched,
preemption and speculative decoding keep both right, bad constraints are refused up front."""
from __future__ import annotations

import re

import pytest

from tokenmill import LLM, SamplingParams, StructuredOutputsParams
from tokenmill.engine.validation import RequestValidationError

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 33 + 2 * i, 40, 41, 42] * 3} for i in range(6)]


def _regex(pattern: str, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=64, temperature=0, structured_outputs=StructuredOutputsParams(regex=pattern), **kw)


def _texts(outs) -> list[str]:
    return [o.outputs[0].text for o in outs]


def test_mixed_batch_leaves_unconstrained_outputs_unchanged(tiny_llm):
    plain = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    alone = tiny_llm.generate(PROMPTS[:3], plain, use_tqdm=False)
    mixed = tiny_llm.generate(PROMPTS, [plain] * 3 + [_regex("[a-c]{3,8}"), _regex("(yes|no)"),
                                                      _regex("[0-9]{4}-[0-9]{2}")], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == [o.outputs[0].token_ids for o in alone]
    for out, pattern in zip(mixed[3:], ["[a-c]{3,8}", "(yes|no)", "[0-9]{4}-[0-9]{2}"]):
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"


@pytest.mark.parametrize("kind", ["choice", "grammar_lark", "grammar_gbnf", "json"])
def test_each_kind_of_constraint_is_obeyed_sampled(tiny_llm, kind):
    constraint = {
        "choice": StructuredOutputsParams(choice=["red", "green", "blue"]),
        "grammar_lark": StructuredOutputsParams(grammar='start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9]/'),
        "grammar_gbnf": StructuredOutputsParams(grammar='root ::= "(" num ("+" num)? ")"\nnum ::= [1-9]'),
        "json": StructuredOutputsParams(json={"type": "object", "properties": {"ok": {"type": "boolean"}},
                                              "required": ["ok"], "additionalProperties": False}),
    }[kind]
    check = {
        "choice": lambda t: t in ("red", "green", "blue"),
        "grammar_lark": lambda t: re.fullmatch(r"\([1-9](\+[1-9])*\)", t),
        "grammar_gbnf": lambda t: re.fullmatch(r"\([1-9](\+[1-9])?\)", t),
        "json": lambda t: t in ('{"ok": true}', '{"ok": false}'),
    }[kind]
    params = SamplingParams(n=4, max_tokens=48, temperature=1.0, seed=3, structured_outputs=constraint)
    outs = tiny_llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for c in (c for o in outs for c in o.outputs):
        assert c.finish_reason == "stop" and check(c.text), c.text


def test_grammar_that_cannot_finish_ends_with_length(tiny_llm):
    out = tiny_llm.generate(PROMPTS[:1], SamplingParams(max_tokens=5, temperature=0,
                                                        structured_outputs=StructuredOutputsParams(regex="a{20}")),
                            use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and re.fullmatch("a+", out.text) and len(out.token_ids) == 5


@pytest.mark.parametrize("constraint, words", [
    (StructuredOutputsParams(json={"type": "nonsense"}), "nonsense"),
    (StructuredOutputsParams(json="{not json"), "not valid JSON"),
    (StructuredOutputsParams(regex="(unclosed"), "unclosed"),
    (StructuredOutputsParams(grammar="start: missing_rule"), "missing_rule"),
])
def test_invalid_constraint_is_refused_before_queueing(tiny_llm, constraint, words):
    engine = tiny_llm.llm_engine
    with pytest.raises(RequestValidationError, match=words) as e:
        engine.add_request(None, PROMPTS[0], SamplingParams(structured_outputs=constraint))
    assert e.value.param == "structured_outputs"
    assert not engine.has_unfinished_requests()


def test_structured_outputs_params_needs_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_compiled_grammars_are_cached_by_constraint(tiny_llm):
    compiler = tiny_llm.llm_engine.grammar_compiler
    compiler.clear()
    misses = compiler.stats.misses
    params = SamplingParams(max_tokens=8, temperature=0, structured_outputs=StructuredOutputsParams(regex="[xyz]{1,4}"))
    tiny_llm.generate(PROMPTS[:4], params, use_tqdm=False)
    assert compiler.stats.misses == misses + 1


def test_preemption_and_resume_keep_the_grammar_state(tiny_llama):
    """A cache too small for all: requests are preempted mid-output and resume with a matcher
    rebuilt from their tokens; greedy outputs equal an unpressured run's."""
    params = [_regex("[ab]{30}x"), SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)] * 4
    prompts = PROMPTS + PROMPTS[:2]
    roomy = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4)
    expect = _texts(roomy.generate(prompts, params, use_tqdm=False))
    tight = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=40, block_size=4, max_num_batched_tokens=64)
    got = _texts(tight.generate(prompts, params, use_tqdm=False))
    assert tight.llm_engine.core.scheduler.num_preemptions > 0
    assert got == expect
    assert all(re.fullmatch("[ab]{30}x", t) for t in got[0::2])


def test_speculative_decoding_skips_drafts_for_constrained_requests(tiny_llama):
    prompts = [{"prompt_token_ids": [7, 8, 9, 10] * 6}] * 4
    params = [_regex("[ab]{12}"), SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)] * 2
    plain = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4)
    spec = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, speculative_config=NGRAM)
    expect = plain.generate(prompts, params, use_tqdm=False)
    outs = spec.generate(prompts, params, use_tqdm=False)
    assert _texts(outs) == _texts(expect)
    assert all(re.fullmatch("[ab]{12}", t) for t in _texts(outs)[0::2])
    assert not any(o.metrics.spec_decoding and o.metrics.spec_decoding.num_draft_tokens for o in outs[0::2])
    assert sum(o.metrics.spec_decoding.num_draft_tokens for o in outs[1::2] if o.metrics.spec_decoding) > 0


def test_min_tokens_with_a_constraint_is_refused():
    with pytest.raises(ValueError, match="min_tokens must be 0 with structured_outputs"):
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputsParams(choice=["a"]))
