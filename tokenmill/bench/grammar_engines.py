"""Grammar engines side by side on this CPU: llguidance (ours) and xgrammar, if installed.

For one JSON schema on the default model's tokenizer: the one-time tokenizer preparation, the
schema's compile time and the next-token mask time along a valid output (median and max). The
install sizes are in docs/BENCHMARKS.md (xgrammar is not a tokenmill dependency: `pip install
--no-deps xgrammar apache-tvm-ffi` to compare without pulling triton).

    python -m tokenmill.bench.grammar_engines [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from tokenmill.bench.script import run_script, write_record

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "tags", "ok"], "additionalProperties": False}
TEXT = '{"name": "Bob Smith", "age": 42, "tags": ["a", "c"], "ok": true}'


def llguidance_times(tok, vocab: int, ids: list[int]) -> tuple[float, float, list[float]]:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA))
    compiled = time.perf_counter() - t0
    mask, fills = lt.allocate_token_bitmask(1, vocab), []
    for i in ids:
        t0 = time.perf_counter()
        lt.fill_next_token_bitmask(m, mask)
        fills.append(time.perf_counter() - t0)
        assert m.consume_token(i)
    return prep, compiled, fills


def xgrammar_times(tok, vocab: int, ids: list[int]) -> tuple[float, float, list[float]]:
    import xgrammar as xgr
    t0 = time.perf_counter()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab), cache_enabled=False)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA)))
    compiled = time.perf_counter() - t0
    mask, fills = xgr.allocate_token_bitmask(1, vocab), []
    for i in ids:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(mask)
        fills.append(time.perf_counter() - t0)
        assert m.accept_token(i)
    return prep, compiled, fills


def run(args: argparse.Namespace) -> int:
    from tokenmill.bench.offline import machine
    from tokenmill.engine.tokenizer import load_tokenizer
    from tokenmill.models.default_model import resolve_default_model
    tok = load_tokenizer(resolve_default_model())
    vocab, ids = len(tok), tok.encode(TEXT)
    rows = {}
    print(f"machine: {machine()}; date: {time.strftime('%Y-%m-%d %H:%M')}; {len(ids)} tokens of output")
    for name, fn in (("llguidance", llguidance_times), ("xgrammar", xgrammar_times)):
        try:
            prep, compiled, fills = fn(tok, vocab, ids)
        except ImportError:
            print(f"{name}: not installed")
            continue
        rows[name] = {"tokenizer_prep_ms": prep * 1e3, "compile_ms": compiled * 1e3,
                      "mask_us_median": statistics.median(fills) * 1e6, "mask_us_max": max(fills) * 1e6}
        r = rows[name]
        print(f"{name}: tokenizer prep {r['tokenizer_prep_ms']:.0f} ms, schema compile {r['compile_ms']:.1f} ms, "
              f"mask median {r['mask_us_median']:.0f} µs, max {r['mask_us_max']:.0f} µs")
    write_record(args.json, engines=rows)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None)


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
