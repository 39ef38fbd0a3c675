"""Structured outputs: decode speed with and without a JSON schema, grammar compile time, and how
often the model writes valid JSON without constraints.

1. Decode: B requests (greedy, ignore_eos, max_tokens T) at batch 1 and 32, without a constraint
   and with a JSON schema that cannot finish within T tokens (an array of 64 objects), so both
   runs decode exactly T tokens per request. TPOT = (last token - first token) / (T - 1) per
   request (median); decode tok/s = B / TPOT.
2. Compile: each schema compiled cold (empty cache) and again from the cache (a hit plus the copy
   a request starts from); the tokenizer's one-time load is reported apart.
3. Valid JSON: the same "reply with JSON following this schema" chat prompts, greedy, without
   and with the schema as a constraint: the share that parses and validates (jsonschema).

    python -m tokenmill.bench.structured --dtype float32 [--batches 1,32] [--tokens 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from tokenmill.bench.script import run_script, write_record

ITEM = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
LONG_SCHEMA = {"type": "array", "items": ITEM, "minItems": 64, "maxItems": 64}

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
                                      "genres": {"type": "array", "items": {"type": "string"}}},
     "required": ["title", "year", "genres"]},
    {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                      "population": {"type": "integer", "minimum": 0}},
     "required": ["city", "country", "population"]},
    {"type": "object", "properties": {"product": {"type": "string"}, "price": {"type": "number", "minimum": 0},
                                      "in_stock": {"type": "boolean"}}, "required": ["product", "price", "in_stock"]},
    {"type": "object", "properties": {"event": {"type": "string"}, "date": {"type": "string",
                                                                            "pattern": r"^\d{4}-\d{2}-\d{2}$"}},
     "required": ["event", "date"]},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                      "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["sentiment", "confidence"]},
    {"type": "object", "properties": {"answer": {"type": "string"},
                                      "sources": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
     "required": ["answer", "sources"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer"}, "email": {"type": "string"}}, "required": ["id", "email"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]},
]
TASKS = ["Describe a person.", "Describe a film.", "Describe a city.", "Describe a product for sale.",
         "Describe a historical event.", "Rate the sentiment of: 'I loved this place!'",
         "Answer: what is the boiling point of water?", "Describe a user account."]
PHRASINGS = ["{task} Reply with a JSON object following this schema: {schema}",
             "{task} Answer only with JSON that matches this JSON schema:\n{schema}"]


def decode(llm, batch: int, tokens: int, schema: dict | None) -> dict:
    from tokenmill import SamplingParams, StructuredOutputsParams
    constraint = StructuredOutputsParams(json=schema) if schema is not None else None
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, structured_outputs=constraint)
    prompts = [f"List people as JSON, one per line. Batch member {i}:" for i in range(batch)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
    tpot = statistics.median((o.metrics.last_token_time - o.metrics.first_token_time) / (tokens - 1) for o in outs)
    return {"tpot_ms": tpot * 1e3, "decode_tok_s": batch / tpot}


def compile_times(llm) -> dict:
    from tokenmill import StructuredOutputsParams
    t0 = time.perf_counter()
    compiler = llm.llm_engine.grammar_compiler
    load = time.perf_counter() - t0
    compiler.clear()
    cold, cached = [], []
    for schema in SCHEMAS + [LONG_SCHEMA]:
        p = StructuredOutputsParams(json=schema)
        t0 = time.perf_counter()
        compiler.compile(p)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        compiler.matcher(p)
        cached.append(time.perf_counter() - t0)
    return {"tokenizer_load_ms": load * 1e3, "cold_ms_median": statistics.median(cold) * 1e3,
            "cold_ms_max": max(cold) * 1e3, "cached_us_median": statistics.median(cached) * 1e6,
            "cached_us_max": max(cached) * 1e6}


def valid_json_share(llm, max_tokens: int) -> dict:
    import jsonschema
    from tokenmill import SamplingParams, StructuredOutputsParams
    tok = llm.get_tokenizer()
    cases = [(s, p.format(task=t, schema=json.dumps(s))) for p in PHRASINGS for s, t in zip(SCHEMAS, TASKS)]
    prompts = [tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
               for _, text in cases]
    result = {"prompts": len(cases)}
    for label, constrained in (("unconstrained", False), ("constrained", True)):
        params = [SamplingParams(max_tokens=max_tokens, temperature=0,
                                 structured_outputs=StructuredOutputsParams(json=s) if constrained else None)
                  for s, _ in cases]
        outs = llm.generate(prompts, params, use_tqdm=False)
        texts = [o.outputs[0].text for o in outs]
        result[f"{label}_valid"] = sum(_valid(t, s, jsonschema) for t, (s, _) in zip(texts, cases))
        result[f"{label}_parses"] = sum(_parses(t) is not None for t in texts)
        result[f"{label}_valid_extracted"] = sum(_valid(_extract(t), s, jsonschema) for t, (s, _) in zip(texts, cases))
        result[f"{label}_finished"] = sum(o.outputs[0].finish_reason == "stop" for o in outs)
    return result


def _extract(text: str) -> str:
    """The JSON a lenient client would dig out: a fenced block, else the first { to the last }."""
    if "```" in text:
        body = text.split("```", 2)[1]
        return body.removeprefix("json").strip()
    return text[text.find("{"): text.rfind("}") + 1]


def _parses(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _valid(text: str, schema: dict, jsonschema) -> bool:
    value = _parses(text)
    return value is not None and jsonschema.Draft202012Validator(schema).is_valid(value)


def run(args: argparse.Namespace) -> int:
    from tokenmill import LLM
    from tokenmill.bench.offline import machine
    llm = LLM(args.model, dtype=args.dtype, max_model_len=512, kv_cache_memory_gb=args.kv_cache_memory_gb)
    compiled = compile_times(llm)
    decode(llm, 2, 8, LONG_SCHEMA)  # warm-up
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        runs = {"plain": [], "json_schema": []}
        for _ in range(args.repeats):  # alternating, so a neighbour's load hits both alike
            runs["plain"].append(decode(llm, batch, args.tokens, None))
            runs["json_schema"].append(decode(llm, batch, args.tokens, LONG_SCHEMA))
        best = {k: min(v, key=lambda r: r["tpot_ms"]) for k, v in runs.items()}
        rows.append({"batch": batch, **best,
                     "overhead_pct": (best["json_schema"]["tpot_ms"] / best["plain"]["tpot_ms"] - 1) * 100})
    share = valid_json_share(llm, args.valid_max_tokens)
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; dtype {args.dtype}; "
          f"{args.tokens} tokens per request, best of {args.repeats}")
    print(f"{'batch':>6}{'TPOT ms':>10}{'tok/s':>9}{'TPOT ms (schema)':>18}{'tok/s (schema)':>16}{'overhead':>10}")
    for r in rows:
        print(f"{r['batch']:>6}{r['plain']['tpot_ms']:>10.2f}{r['plain']['decode_tok_s']:>9.1f}"
              f"{r['json_schema']['tpot_ms']:>18.2f}{r['json_schema']['decode_tok_s']:>16.1f}"
              f"{r['overhead_pct']:>9.1f}%")
    print(f"grammar compile: tokenizer load {compiled['tokenizer_load_ms']:.0f} ms once; cold median "
          f"{compiled['cold_ms_median']:.2f} ms (max {compiled['cold_ms_max']:.2f}); cached median "
          f"{compiled['cached_us_median']:.1f} µs (max {compiled['cached_us_max']:.1f})")
    n = share["prompts"]
    print(f"valid JSON (parses and validates) over {n} prompts, greedy, max_tokens {args.valid_max_tokens}: "
          f"unconstrained {share['unconstrained_valid']}/{n} (parses: {share['unconstrained_parses']}; valid after "
          f"extracting a fenced block or {{...}}: {share['unconstrained_valid_extracted']}), constrained "
          f"{share['constrained_valid']}/{n} (finished within max_tokens: {share['constrained_finished']})")
    write_record(args.json, decode=rows, compile=compiled, valid_json=share, dtype=args.dtype, tokens=args.tokens)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--valid-max-tokens", type=int, default=160)
    p.add_argument("--kv-cache-memory-gb", type=float, default=0.5)
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
