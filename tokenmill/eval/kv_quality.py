"""Quality of the quantized KV cache: perplexity and greedy agreement per kv_cache_dtype.

For each KV dtype (auto = the model dtype, int8, fp8) on the same model and weights:

- perplexity over the shipped public-domain passage (tokenmill/data/alice_ch1_2.txt, 4,467 tokens
  for SmolLM2), scored in chunks through the engine's paged KV cache: every chunk writes its K/V
  into the cache (quantized, for int8/fp8) and attends to everything before it by reading the
  cache back (dequantized), exactly as a chunked prefill does;
- greedy agreement with `auto` over `--gen-tokens` generated tokens for `--num-prompts` prompts
  (ignore_eos, so every position counts): the mean fraction of positions before the first
  divergence, and the fraction of all positions with equal tokens.

    python -m tokenmill.eval.kv_quality [--out docs/benchmarks/kv_quality.md] [--ablation]

`--ablation` adds a plain bfloat16 KV cache (how far 2-byte storage alone moves the outputs), and
int8/fp8 with exact float32 scales instead of the 1-byte log8 scale code. `--kv-dtypes` picks any of
auto, int8, fp8, bf16, int8/fp32-scale, fp8/fp32-scale (the first is the reference).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from tokenmill.models.registry import get_model_class

from tokenmill.attention.backend import BatchLayout
from tokenmill.attention.kv_cache import KV_PLAIN_DTYPES
from tokenmill.data import read_text
from tokenmill.bench.script import run_script

PROMPTS = [
    # plain completions
    "The history of the printing press begins",
    "In the middle of the ocean, far from any coast, there is",
    "def merge_sort(items):\n",
    "The three laws of motion described by Isaac Newton are",
    "Photosynthesis is the process by which",
    "Once upon a time, in a village at the edge of a great forest,",
    "The main difference between a virus and a bacterium is",
    "To make a good cup of tea, first",
    "The city of Rome was founded, according to legend,",
    "SELECT name, COUNT(*) FROM orders",
    # chat turns (the instruct model's own format)
    "<|im_start|>user\nExplain what a hash table is.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a short poem about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat causes the seasons on Earth?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nGive me three tips for learning a new language.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHow does a bicycle stay upright?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSummarize the plot of Romeo and Juliet.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the difference between weather and climate?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nDescribe a healthy breakfast.<|im_end|>\n<|im_start|>assistant\n",
]


@dataclass
class Variant:
    name: str
    kv_cache_dtype: str
    scale_format: str = "log8"  # log8: the engine's 1-byte scale code; fp32: exact scales (ablation)
    note: str = ""


@dataclass
class VariantResult:
    variant: Variant
    bytes_per_token: float
    blocks_at_half_gib: int
    ppl: float
    outputs: list[list[int]] = field(default_factory=list)
    top1_agreement: float = 1.0  # teacher-forced: argmax next token equal to the reference's
    prefix_agreement: float | None = None
    overall_agreement: float | None = None
    identical: int | None = None
    seconds: float = 0.0


# -- scoring through the paged cache -----------------------------------------------------------
@torch.inference_mode()
def chunked_scores(engine, token_ids: list[int], chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """For i < n-1: log p(token[i+1] | token[:i+1]) and the argmax next token, computed chunk by
    chunk through the engine's KV cache: each chunk writes its K/V into the (possibly quantized)
    cache, then its attention reads all K/V up to itself back from the cache, like a chunked
    prefill. Blocks come from the engine's block pool (evicting any cached prefix they held) and go
    back afterwards, so the prefix cache stays consistent. The engine must be idle."""
    runner, pool = engine.runner, engine.core.kv.pool
    if pool.num_used_blocks:
        raise RuntimeError("chunked_scores needs an idle engine (requests hold KV blocks)")
    bs, n = runner.block_size, len(token_ids)
    blocks = pool.allocate(-(-n // bs))
    try:
        block_ids = [b.block_id for b in blocks]
        table = torch.tensor(block_ids)
        ids = torch.tensor(token_ids)
        logps, top1 = [], []
        for start in range(0, n - 1, chunk):
            end = min(n, start + chunk)
            pos = torch.arange(start, end)
            layout = BatchLayout(table[pos // bs] * bs + pos % bs, [0, end - start], [end], [block_ids], bs)
            meta = runner.backend.build_metadata(layout)
            hidden = runner.model(ids[start:end], pos, runner.kv_caches, runner.backend, meta)
            targets = ids[start + 1:end + 1]
            logp = torch.log_softmax(runner.model.compute_logits(hidden[:len(targets)]), dim=-1)
            logps.append(logp.gather(1, targets[:, None]).squeeze(1))
            top1.append(logp.argmax(-1))
        return torch.cat(logps), torch.cat(top1)
    finally:
        pool.free(list(reversed(blocks)))


_PLAIN_KV_DTYPES = {**KV_PLAIN_DTYPES, "float16": torch.float16}  # float16: a reference point only


def use_kv_cache(engine, kv_cache_dtype: str, scale_format: str = "log8") -> None:
    """Evaluation only: give an idle engine a fresh KV cache of another dtype (or scale format)
    with the same number of blocks, so several KV dtypes can be compared on one loaded model. The
    prefix cache is reset and re-keyed, since cached blocks do not survive the swap."""
    from tokenmill.attention.kv_cache import KVCacheSpec, make_kv_cache_spec
    runner, kv = engine.runner, engine.core.kv
    if engine.has_unfinished_requests() or kv.pool.num_used_blocks:
        raise RuntimeError("use_kv_cache needs an idle engine")
    cfg = engine.config.model.arch
    if kv_cache_dtype in _PLAIN_KV_DTYPES:  # a plain cache in another float dtype (reference points)
        spec = KVCacheSpec(runner.num_blocks, runner.block_size, cfg.num_kv_heads, cfg.head_dim,
                           _PLAIN_KV_DTYPES[kv_cache_dtype])
    else:
        spec = make_kv_cache_spec(kv_cache_dtype, runner.dtype, runner.block_size, cfg.num_kv_heads, cfg.head_dim,
                                  runner.num_blocks, scale_format)
    runner.kv_caches = []  # free the old tensors before allocating the new ones
    runner.kv_caches = [spec.allocate() for _ in range(cfg.num_layers)]
    runner.kv_spec = spec
    runner.kv_bytes_per_token = spec.bytes_per_token * cfg.num_layers
    kv.extra_key = f"{engine.config.model.content_id}|kv={kv_cache_dtype}|{getattr(spec, 'scale_format', '')}"
    kv.reset_prefix_cache()


# -- agreement ------------------------------------------------------------------------------------
def agreement(reference: list[list[int]], outputs: list[list[int]]) -> tuple[float, float, int]:
    """(mean fraction of positions before the first divergence, fraction of equal positions,
    number of fully identical outputs)."""
    prefix, equal, total, identical = [], 0, 0, 0
    for ref, out in zip(reference, outputs):
        n = len(ref)
        first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(n, len(out)))
        prefix.append(first / n)
        equal += sum(a == b for a, b in zip(ref, out))
        total += n
        identical += ref == out
    return sum(prefix) / len(prefix), equal / total, identical


# -- the run --------------------------------------------------------------------------------------
@dataclass
class Report:
    results: list[VariantResult]
    num_tokens: int
    bf16_bytes_per_token: float  # the dtype the "halve" refers to (computed, not run here)
    bf16_blocks_at_half_gib: int


def evaluate(model: str | None = None, variants: list[Variant] | None = None, num_tokens: int = 0,
             num_prompts: int = 20, gen_tokens: int = 256, chunk: int = 256, dtype: str = "float32",
             log=print, llm=None) -> Report:
    """One model load; each variant gets its own KV cache (use_kv_cache). The first variant is the
    reference for agreement."""
    from tokenmill import LLM, SamplingParams

    variants = variants or default_variants()
    prompts = PROMPTS[:num_prompts]
    if llm is None:
        from transformers import AutoTokenizer

        from tokenmill.engine.resolve import resolve_model_folder
        folder = resolve_model_folder(model)
        tok = AutoTokenizer.from_pretrained(str(folder))
        n_text = len(tok.encode(read_text(), add_special_tokens=False))
        need = max(num_tokens or n_text, sum(len(tok.encode(p)) + gen_tokens + 16 for p in prompts))
        llm = LLM(str(folder), dtype=dtype, num_kv_blocks=-(-need // 16) + 8)
    engine = llm.llm_engine
    cfg = engine.config.model.arch
    ids = llm.get_tokenizer().encode(read_text(), add_special_tokens=False)
    ids = ids[:num_tokens] if num_tokens else ids
    params = SamplingParams(max_tokens=gen_tokens, temperature=0, ignore_eos=True)
    results: list[VariantResult] = []
    ref_top1 = None
    for variant in variants:
        t0 = time.perf_counter()
        use_kv_cache(engine, variant.kv_cache_dtype, variant.scale_format)
        spec = engine.runner.kv_spec
        logp, top1 = chunked_scores(engine, ids, chunk)
        ppl = math.exp(-logp.double().mean().item())
        ref_top1 = top1 if ref_top1 is None else ref_top1
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] if prompts else []
        r = VariantResult(variant, spec.bytes_per_token * cfg.num_layers,
                          int((1 << 29) // (spec.bytes_per_block * cfg.num_layers)), ppl, outs,
                          top1_agreement=(top1 == ref_top1).double().mean().item(),
                          seconds=time.perf_counter() - t0)
        results.append(r)
        log(f"{variant.name}: ppl {ppl:.4f} over {len(ids)} tokens, top-1 agreement {r.top1_agreement:.4f}, "
            f"{r.bytes_per_token:.0f} B/token, {r.blocks_at_half_gib} blocks at 0.5 GiB, {r.seconds:.0f}s")
    use_kv_cache(engine, engine.config.cache.kv_cache_dtype)
    for r in results:
        if results[0].outputs:
            r.prefix_agreement, r.overall_agreement, r.identical = agreement(results[0].outputs, r.outputs)
    bf16_per_token = get_model_class(cfg.architecture).kv_bytes_per_token(cfg, "auto", torch.bfloat16, 16)
    return Report(results, len(ids), bf16_per_token, int((1 << 29) // (bf16_per_token * 16)))


def default_variants(ablation: bool = False) -> list[Variant]:
    out = [Variant("auto", "auto", note="model dtype"),
           Variant("int8", "int8", note="1-byte log8 scale per (token, KV head)"),
           Variant("fp8", "fp8", note="e4m3, 1-byte log8 scale per (token, KV head)")]
    if ablation:
        out += [Variant("bf16", "bfloat16", note="plain bfloat16 KV (model float32): the 2-byte reference"),
                Variant("int8/fp32-scale", "int8", "fp32", "fp32 scale per (token, KV head)"),
                Variant("fp8/fp32-scale", "fp8", "fp32", "e4m3, fp32 scale per (token, KV head)")]
    return out


def markdown(report: Report, meta: dict) -> str:
    results = report.results
    ref = results[0]
    bf16_bpt, bf16_blocks = report.bf16_bytes_per_token, report.bf16_blocks_at_half_gib
    lines = [(f"Model {meta['model']}, weights and activations {meta['dtype']}, block size 16. Perplexity and "
             f"teacher-forced top-1 agreement over {report.num_tokens} tokens of tokenmill/data/alice_ch1_2.txt, "
             f"scored in chunks of {meta['chunk']} tokens through the paged KV cache; greedy generation agreement "
             f"with `{ref.variant.name}` over {meta['gen_tokens']} tokens x {meta['num_prompts']} prompts "
             "(ignore_eos)."), "",
             ("| kv_cache_dtype | scales | KV bytes/token | vs bf16 | blocks @ 0.5 GiB | vs bf16 | perplexity | "
             "Δ ppl | top-1 agreement | greedy prefix agreement | greedy token agreement | identical outputs |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| (bf16, computed) | - | {bf16_bpt:,.0f} | 1.000 | {bf16_blocks:,} | 1.000x | | | | | | |"]
    for r in results:
        agree = (f"{r.prefix_agreement:.3f} | {r.overall_agreement:.3f} | {r.identical}/{len(r.outputs)}"
                 if r.prefix_agreement is not None else "- | - | -")
        dppl = (r.ppl / ref.ppl - 1) * 100
        lines.append(f"| {r.variant.name} | {r.variant.note} | {r.bytes_per_token:,.0f} | "
                     f"{r.bytes_per_token / bf16_bpt:.3f} | {r.blocks_at_half_gib:,} | "
                     f"{r.blocks_at_half_gib / bf16_blocks:.3f}x | {r.ppl:.4f} | {dppl:+.2f}% | "
                     f"{r.top1_agreement:.4f} | {agree} |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", help="model (weights and activations) dtype")
    p.add_argument("--kv-dtypes", default="auto,int8,fp8",
                   help="comma-separated, from: auto, int8, fp8, bf16, int8/fp32-scale, fp8/fp32-scale; "
                        "the first is the reference")
    p.add_argument("--ablation", action="store_true", help="add per-token-scale variants")
    p.add_argument("--num-tokens", type=int, default=0, help="score only the first N tokens (0: all)")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--gen-tokens", type=int, default=256)
    p.add_argument("--chunk", type=int, default=256, help="tokens per scoring chunk")
    p.add_argument("--out", default=None, help="write the Markdown table here")


def run(args: argparse.Namespace) -> int:
    from tokenmill.bench.offline import machine
    names = args.kv_dtypes.split(",")
    by_name = {v.name: v for v in default_variants(ablation=True)}
    extra = ["bf16", "int8/fp32-scale", "fp8/fp32-scale"] if args.ablation else []
    variants = [by_name[n] for n in names + [e for e in extra if e not in names]]
    t0 = time.perf_counter()
    report = evaluate(args.model, variants, args.num_tokens, args.num_prompts, args.gen_tokens, args.chunk,
                       args.dtype, log=lambda s: print(s, file=sys.stderr, flush=True))
    meta = {"model": args.model or "SmolLM2-135M-Instruct", "dtype": args.dtype, "chunk": args.chunk,
            "gen_tokens": args.gen_tokens, "num_prompts": args.num_prompts}
    table = markdown(report, meta)
    cmd = "python -m tokenmill.eval.kv_quality " + " ".join(sys.argv[1:])
    text = (f"{table}\nCommand: `{cmd.strip()}`; machine: {machine()}; date: {time.strftime('%Y-%m-%d')}; "
            f"took {time.perf_counter() - t0:.0f} s (load average at the end {os.getloadavg()[0]:.1f}).\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_script(__doc__, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
