"""Property test with the default model: for random small JSON schemas (objects, arrays, enums,
nesting, bounded integers and numbers, strings with lengths and patterns), every constrained
output finishes within max_tokens, parses and validates, greedy and sampled. Every value is
bounded in length, so finishing is the grammar's doing, not luck."""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenmill import LLM, SamplingParams, StructuredOutputsParams

MAX_TOKENS = 96  # json_object mode (unbounded)
WORDS = ["alpha", "beta", "gamma", "red", "blue", "ok", "none"]
KEYS = ["id", "name", "size", "color", "items", "flag", "score", "tags", "child"]


@pytest.fixture(scope="module")
def llm(smollm2_folder):
    return LLM(str(smollm2_folder), dtype="float32", kv_cache_memory_gb=0.25, max_model_len=2048)


def _leaf() -> st.SearchStrategy[dict]:
    bounds = st.tuples(st.integers(-50, 50), st.integers(0, 100)).map(lambda t: (t[0], t[0] + t[1]))
    return st.one_of(
        bounds.map(lambda b: {"type": "integer", "minimum": b[0], "maximum": b[1]}),
        # multipleOf bounds the digits: a bare number may run on in decimals until max_tokens
        bounds.map(lambda b: {"type": "number", "minimum": b[0], "maximum": b[1], "multipleOf": 0.25}),
        st.just({"type": "boolean"}),
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True).map(lambda e: {"enum": e}),
        st.integers(1, 8).map(lambda n: {"type": "string", "minLength": 1, "maxLength": n}),
        st.sampled_from([r"^[a-z]{2,5}$", r"^[A-Z][0-9]{2}$", r"^(yes|no)$"]).map(
            lambda p: {"type": "string", "pattern": p}),
    )


def _schema(depth: int = 2) -> st.SearchStrategy[dict]:
    child = _leaf() if depth == 0 else st.one_of(_leaf(), _schema(depth - 1))
    array = st.tuples(child, st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": min(1, t[1]), "maxItems": t[1] + 1})
    props = st.dictionaries(st.sampled_from(KEYS), st.one_of(child, array), min_size=1, max_size=3)
    return props.map(lambda p: {"type": "object", "properties": p, "required": sorted(p),
                                "additionalProperties": False})


def _max_bytes(schema: dict) -> int:
    """An upper bound on the bytes of any output for our schemas (a token is at least one byte):
    a string character may be written as a 6-byte escape, a number has two decimals at most."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema["type"]
    if kind == "boolean":
        return 5
    if kind in ("integer", "number"):
        return max(len(str(schema["minimum"])), len(str(schema["maximum"]))) + (3 if kind == "number" else 0)
    if kind == "string":
        return 2 + 6 * schema.get("maxLength", 6)
    if kind == "array":
        return 2 + schema["maxItems"] * (_max_bytes(schema["items"]) + 2)
    return 2 + sum(len(k) + 4 + _max_bytes(v) + 2 for k, v in schema["properties"].items())


def _prompt(llm: LLM, schema: dict) -> str:
    messages = [{"role": "user", "content": f"Reply with a JSON object following this schema: {json.dumps(schema)}"}]
    return llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _check(outs, schemas) -> None:
    for out, schema in zip(outs, schemas):
        for c in out.outputs:
            assert c.finish_reason == "stop", (schema, c.text, getattr(out, "error", None))
            jsonschema.validate(json.loads(c.text), schema)


@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(_schema(), min_size=3, max_size=3))
def test_random_schemas_greedy_and_sampled(llm, schemas):
    prompts = [_prompt(llm, s) for s in schemas]
    greedy = [SamplingParams(max_tokens=_max_bytes(s) + 1, temperature=0,
                             structured_outputs=StructuredOutputsParams(json=s)) for s in schemas]
    sampled = [SamplingParams(n=2, max_tokens=_max_bytes(s) + 1, temperature=0.9, seed=5,
                              structured_outputs=StructuredOutputsParams(json=s)) for s in schemas]
    outs = llm.generate(prompts + prompts, greedy + sampled, use_tqdm=False)
    _check(outs, schemas + schemas)


def test_json_object_mode_gives_an_object(llm):
    schema = {"type": "object"}
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                            structured_outputs=StructuredOutputsParams(json_object=True))
    out = llm.generate([_prompt(llm, {"name": "string"})], params, use_tqdm=False)[0].outputs[0]
    if out.finish_reason == "stop":  # an unbounded object may run past max_tokens; a cut one is "length"
        jsonschema.validate(json.loads(out.text), schema)
    else:
        assert out.finish_reason == "length" and out.text.startswith("{")
