"""Microbenchmarks of our C++ kernels against what they replaced (figures in docs/BENCHMARKS.md).

  attention  decode attention per layer, batch 64 x ~262 context, 9 query / 3 KV heads, D=64:
             torch.ops.tokenmill.paged_decode vs gather_blocks + SDPA, for auto/int8/fp8 caches
  prefill    a fresh prompt's causal attention per layer (L = 128-2048): prefill_attention with
             float32 math, with bf16 math over a bf16 cache (AVX512_BF16), and SDPA in 128-query pieces
  gemm       the default model's linear shapes, 30 distinct fp32 weights each, 1-1024 rows:
             panel_linear vs oneDNN with a prepacked weight (GFLOP/s; GB/s of weight at 1-8 rows)
  isa        the same shapes through every instruction-set path this CPU runs: bf16 panel GEMM
             (AVX512_BF16 dot products, AVX-512 and AVX2 widening) vs oneDNN with a prepacked bf16
             weight, and the float32 panel GEMM on AVX-512 vs AVX2
  decode     paged_decode per layer on each instruction-set path this CPU runs (AVX-512, AVX2),
             bf16 and float32 caches, W1-like contexts (64-700 tokens), 29 and 64 sequences; every
             call reads a cache no other call touched just before (DRAM, as in a model's step),
             levels alternated; GB/s of K/V read; then ns per token with the K/V in cache
  blocks     paged_decode (bf16 cache in huge pages, scattered blocks, DRAM) by KV block size 16-128,
             on each decode level this CPU runs (AVX-512, AVX2)
  split      paged_decode at 1-2 sequences of 256-16k tokens (bf16 cache, 30 layers' caches in turn,
             DRAM): long contexts cut into pieces (the default) vs whole (batch-invariant mode), on
             each decode level this CPU runs

    python -m tokenmill.bench.kernels [--threads 2] [--only attention,prefill,gemm,isa,decode,blocks,split]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from tokenmill.bench.gemm import time_call


def _ms(fn, repeats: int = 30) -> float:
    return time_call(fn, repeats) * 1e3


def attention(batch: int = 64, heads: int = 9, kv_heads: int = 3, d: int = 64, bs: int = 16, nb: int = 17) -> None:
    from tokenmill.attention.kv_cache import gather_blocks, make_kv_cache_spec, write_kv
    from tokenmill.kernels import cpu_ops
    g = torch.Generator().manual_seed(0)
    for kvd in ("auto", "int8", "fp8"):
        cache = make_kv_cache_spec(kvd, torch.float32, bs, kv_heads, d, 2000).allocate()
        tables = torch.stack([torch.randperm(2000, generator=g)[:nb] for _ in range(batch)])
        lens = torch.randint(nb * bs - 20, nb * bs + 1, (batch,), generator=g)
        slots = (tables[:, :, None] * bs + torch.arange(bs)).reshape(batch, -1)
        for b in range(batch):
            s = slots[b, :lens[b]]
            write_kv(cache, torch.randn(len(s), kv_heads, d), torch.randn(len(s), kv_heads, d), s)
        q = torch.randn(batch, heads, d)
        mask = (torch.arange(nb * bs)[None, :] < lens[:, None])[:, None, None]

        def gathered():
            k, v = gather_blocks(cache, tables, bs, torch.float32)
            return F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=mask, scale=d ** -0.5, enable_gqa=True)[:, :, 0]
        err = (cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5) - gathered()).abs().max().item()
        ours = _ms(lambda: cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5))
        print(f"attention {kvd:>4}: paged_decode {ours:.2f} ms, gather+SDPA {_ms(gathered):.2f} ms (max diff {err:.1e})")


GEMM_SHAPES = ((3072, 576), (576, 1536), (960, 576))  # gate_up, down, qkv of the default model
GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 1024)


def gemm(layers: int = 30, rounds: int = 6) -> None:
    """panel_linear vs oneDNN with a prepacked weight, 30 distinct weights per shape (so they stream
    from memory as in a real forward), the two alternated for `rounds` rounds, best of each (a noisy
    host slows one side of a sequential comparison); GFLOP/s, and the weight's GB/s at 1-8 rows."""
    for n, k in GEMM_SHAPES:
        ws = [torch.randn(n, k) for _ in range(layers)]
        panels = [torch.ops.tokenmill.pack_panels(w) for w in ws]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
        for m in GEMM_ROWS:
            x = torch.randn(m, k)
            fns = {"panel_linear": lambda i: torch.ops.tokenmill.panel_linear(x, panels[i], n, None),
                   "oneDNN packed": lambda i: torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none", [], "")}
            secs = {name: float("inf") for name in fns}
            for _ in range(rounds):
                for name, fn in fns.items():
                    secs[name] = min(secs[name], _ms(lambda: [fn(i) for i in range(layers)], 2 if m > 128 else 5)
                                     / 1e3 / layers)
            rates = ", ".join(f"{name} {2 * m * n * k / s / 1e9:5.1f} GFLOP/s"
                              + (f" ({n * k * 4 / s / 1e9:4.1f} GB/s)" if m <= 8 else "") for name, s in secs.items())
            print(f"gemm {n}x{k} M={m:>4}: {rates}; ratio {secs['oneDNN packed'] / secs['panel_linear']:.2f}x")


def gemm_isa(layers: int = 30) -> None:
    """Every ISA path of our panel GEMMs against oneDNN (prepacked, bf16): GFLOP/s, best of 3."""
    from tokenmill.kernels import cpu_ops
    from tokenmill.quant.unquantized import _has_onednn_bf16_linear
    levels = [lv for lv in cpu_ops.runnable_levels() if lv != "scalar"]
    onednn_bf16 = _has_onednn_bf16_linear()  # torch refuses bf16 reorders on AVX2-only CPUs
    print(f"isa: {cpu_ops.isa()}")
    for n, k in GEMM_SHAPES:
        ws = [torch.randn(n, k) for _ in range(layers)]
        bf16 = [torch.ops.tokenmill.pack_bf16_panels(w.bfloat16()) for w in ws]
        f32 = [torch.ops.tokenmill.pack_panels(w) for w in ws]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w.bfloat16()) for w in ws] if onednn_bf16 else []
        for m in GEMM_ROWS:
            x = torch.randn(m, k)
            xb = x.bfloat16()
            runs = [(f"bf16 {lv}", lv, lambda i: torch.ops.tokenmill.bf16_panel_linear(x, bf16[i], n, None))
                    for lv in levels]
            runs += [(f"f32 {lv}", lv, lambda i: torch.ops.tokenmill.panel_linear(x, f32[i], n, None))
                     for lv in levels if lv != "avx512_bf16"]
            if onednn:
                runs.append(("oneDNN bf16", "auto",
                             lambda i: torch.ops.mkldnn._linear_pointwise(xb, onednn[i], None, "none", [], "")))
            rates = []
            for name, level, fn in runs:
                cpu_ops.set_isa(level)
                s = min(_ms(lambda: [fn(i) for i in range(layers)], 2 if m > 128 else 5) for _ in range(3)) / 1e3 / layers
                rates.append(f"{name} {2 * m * n * k / s / 1e9:5.0f}")
            cpu_ops.set_isa("auto")
            print(f"isa gemm {n}x{k} M={m:>4} GFLOP/s: " + ", ".join(rates))


def prefill_attention(heads: int = 9, kv_heads: int = 3, d: int = 64) -> None:
    """A fresh prompt's causal self-attention per layer: our kernel with float32 math, with bf16 math
    over a bf16 cache (AVX512_BF16 CPUs only; elsewhere that call runs the float32 math), and SDPA in
    128-query pieces (the path it replaced); GFLOP/s count only the unmasked half (4 * H * D * L^2 / 2)."""
    from tokenmill.kernels import cpu_ops
    bf16 = cpu_ops.isa_level() == "avx512_bf16"
    for length in (128, 256, 512, 1024, 2048):
        q = torch.randn(length, heads, d)
        kb, vb = torch.randn(length, kv_heads, d).bfloat16(), torch.randn(length, kv_heads, d).bfloat16()
        k, v = kb.float(), vb.float()
        qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))

        def pieces():
            for qs in range(0, length, 128):
                qe = min(length, qs + 128)
                mask = torch.arange(qe)[None, :] <= (qs + torch.arange(qe - qs))[:, None]
                F.scaled_dot_product_attention(qt[:, :, qs:qe], kt[:, :, :qe], vt[:, :, :qe], attn_mask=mask,
                                               enable_gqa=True)
        reps = max(1, 20 * 128 ** 2 // length ** 2)
        f32 = min(_ms(lambda: torch.ops.tokenmill.prefill_attention(q, k, v, 0, d ** -0.5), reps) for _ in range(3))
        b16 = min(_ms(lambda: torch.ops.tokenmill.prefill_attention(q, kb, vb, 0, d ** -0.5, True), reps)
                  for _ in range(3))
        sdpa = min(_ms(pieces, reps) for _ in range(3))
        flop = 2 * heads * d * length * length
        print(f"prefill attention L={length}: float32 math {f32:.2f} ms ({flop / f32 / 1e6:.0f} GFLOP/s), "
              f"{'bf16 math' if bf16 else 'bf16 cache (float32 math: no AVX512_BF16)'} {b16:.2f} ms "
              f"({flop / b16 / 1e6:.0f} GFLOP/s), SDPA pieces {sdpa:.2f} ms ({flop / sdpa / 1e6:.0f} GFLOP/s); "
              f"float32 / bf16 {f32 / b16:.2f}x, SDPA / float32 {sdpa / f32:.2f}x")


def decode_blocks(heads: int = 9, kv_heads: int = 3, d: int = 64, tokens: int = 6600 * 16, rounds: int = 40) -> None:
    """paged_decode per layer by KV block size, on each decode level this CPU runs (AVX-512, AVX2),
    bf16 cache in huge pages as the engine allocates it, block tables shuffled (blocks scattered
    through the cache), six caches in turn (DRAM reads)."""
    import statistics
    from tokenmill.host_memory import lazy_zeros
    from tokenmill.kernels import cpu_ops
    g = torch.Generator().manual_seed(0)

    def cache():
        out = []
        for _ in range(2):
            t = lazy_zeros(tokens * kv_heads * d * 2).view(torch.bfloat16).view(tokens, kv_heads, d)
            out.append(t.copy_(torch.randn(tokens, kv_heads, d, generator=g)))
        return tuple(out)
    caches = [cache() for _ in range(6)]
    levels = [lv for lv in ("avx512", "avx2") if lv in cpu_ops.runnable_levels()]
    for batch in (29, 64):
        lens = torch.randint(64, 700, (batch,), generator=g)
        q = torch.randn(batch, heads, d, generator=g)
        nbytes = int(lens.sum()) * kv_heads * d * 2 * 2
        tables = {}
        for bs in (16, 32, 64, 128):
            nb = (int(lens.max()) + bs - 1) // bs
            tables[bs] = torch.randperm(tokens // bs, generator=g)[:batch * nb].view(batch, nb).contiguous()
        for level in levels:
            cpu_ops.set_isa(level)
            times: dict[int, list[float]] = {bs: [] for bs in tables}
            for r in range(rounds):
                for i, (bs, table) in enumerate(tables.items()):  # block sizes alternated, caches in turn
                    c = caches[(r * len(tables) + i) % len(caches)]
                    t0 = time.perf_counter()
                    cpu_ops.paged_decode(q, c, table, lens, bs, d ** -0.5)
                    times[bs].append(time.perf_counter() - t0)
            med = {bs: statistics.median(t) for bs, t in times.items()}
            print(f"decode bf16 {level} batch {batch} by block size: " +
                  ", ".join(f"{bs}: {m * 1e6:.0f} us ({nbytes / m / 1e9:.1f} GB/s)" for bs, m in med.items()) +
                  f"; 16 / 32 time {med[16] / med[32]:.2f}x")
        cpu_ops.set_isa("auto")


def decode_isa(heads: int = 9, kv_heads: int = 3, d: int = 64, bs: int = 16, num_blocks: int = 6600,
               rounds: int = 30) -> None:
    """paged_decode per instruction-set level; six caches in turn so that no call finds its K/V in the
    L3 the previous call filled (a model step reads each layer's cache once)."""
    import statistics
    from tokenmill.kernels import cpu_ops
    levels = [lv for lv in ("avx512", "avx2") if lv in cpu_ops.runnable_levels()]
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        caches = [tuple(torch.randn(num_blocks * bs, kv_heads, d, generator=g).to(dtype) for _ in range(2))
                  for _ in range(6)]
        for batch in (29, 64):
            lens = torch.randint(64, 700, (batch,), generator=g)
            nb = (int(lens.max()) + bs - 1) // bs
            tables = torch.randperm(num_blocks, generator=g)[:batch * nb].view(batch, nb).contiguous()
            q = torch.randn(batch, heads, d, generator=g)
            times: dict[str, list[float]] = {lv: [] for lv in levels}
            for r in range(rounds):
                for i, lv in enumerate(levels):
                    cpu_ops.set_isa(lv)
                    cache = caches[(r * len(levels) + i) % len(caches)]
                    t0 = time.perf_counter()  # no warm-up call: it would leave this cache's K/V in L3
                    cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5)
                    times[lv].append(time.perf_counter() - t0)
            cpu_ops.set_isa("auto")
            nbytes = int(lens.sum()) * kv_heads * d * 2 * dtype.itemsize
            med = {lv: statistics.median(t) for lv, t in times.items()}
            ratio = f"; AVX2 / AVX-512 time {med['avx2'] / med['avx512']:.2f}x" if len(med) == 2 else ""
            print(f"decode {str(dtype).removeprefix('torch.')} batch {batch}: " +
                  ", ".join(f"{lv} {m * 1e6:.0f} us ({nbytes / m / 1e9:.1f} GB/s)" for lv, m in med.items()) + ratio)
        # in cache: 4 sequences of 370 tokens in a 200-block cache, the same call repeated (the arithmetic)
        lens = torch.full((4,), 370)
        tables = torch.randperm(200, generator=g)[:4 * 24].view(4, 24).contiguous()
        cache = tuple(c[:200 * bs].clone() for c in caches[0])
        q = torch.randn(4, heads, d, generator=g)
        per_token = {}
        for lv in levels:
            cpu_ops.set_isa(lv)
            per_token[lv] = min(time_call(lambda: cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5), 20)
                                for _ in range(5)) / int(lens.sum())
        cpu_ops.set_isa("auto")
        print(f"decode {str(dtype).removeprefix('torch.')} in cache ({torch.get_num_threads()} threads): " +
              ", ".join(f"{lv} {t * 1e9:.1f} ns per token" for lv, t in per_token.items()))


def decode_split(heads: int = 9, kv_heads: int = 3, d: int = 64, bs: int = 16, layers: int = 30,
                 rounds: int = 8) -> None:
    """Few long contexts: paged_decode's pieces joined by log-sum-exp against whole contexts (tasks of
    one KV head each, what batch-invariant mode keeps). One model step's worth of distinct caches per
    round (512 MB at least), the two alternated pass by pass; median time per layer call and GB/s of
    K/V read."""
    import statistics
    from tokenmill.kernels import cpu_ops
    levels = [lv for lv in ("avx512", "avx2") if lv in cpu_ops.runnable_levels()]
    g = torch.Generator().manual_seed(0)
    for context in (256, 1024, 4096, 16384):
        for batch in (1, 2):
            nb = context // bs
            nbytes = batch * context * kv_heads * d * 2 * 2
            # at least 30 layers and 512 MB of caches: no call finds its K/V in a (large, VM) L3
            count = max(layers, -(-(512 << 20) // nbytes))
            caches = [tuple(torch.empty(batch * nb * bs, kv_heads, d, dtype=torch.bfloat16).normal_(generator=g)
                            for _ in range(2)) for _ in range(count)]
            tables = torch.randperm(batch * nb, generator=g).view(batch, nb).contiguous()
            lens = torch.full((batch,), context)
            q = torch.randn(batch, heads, d, generator=g)
            for lv in levels:
                cpu_ops.set_isa(lv)
                times: dict[str, list[float]] = {"whole": [], "pieces": []}
                for _ in range(rounds):
                    for mode in ("whole", "pieces"):  # a pass over every cache each
                        previous = cpu_ops.set_batch_invariant(mode == "whole")
                        for cache in caches:
                            t0 = time.perf_counter()
                            cpu_ops.paged_decode(q, cache, tables, lens, bs, d ** -0.5)
                            times[mode].append(time.perf_counter() - t0)
                        cpu_ops.set_batch_invariant(previous)
                med = {m: statistics.median(t) for m, t in times.items()}
                print(f"split {lv} context {context} batch {batch} ({torch.get_num_threads()} threads): " +
                      ", ".join(f"{m} {t * 1e6:.0f} us ({nbytes / t / 1e9:.1f} GB/s)" for m, t in med.items()) +
                      f"; whole / pieces time {med['whole'] / med['pieces']:.2f}x")
            cpu_ops.set_isa("auto")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", default="attention,prefill,gemm,isa,decode,blocks,split", help="comma-separated sections")
    args = p.parse_args(argv)
    from tokenmill.kernels import cpu_ops
    if not cpu_ops.load():
        print("error: the C++ kernels could not be built here", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    sections = {"attention": attention, "prefill": prefill_attention, "gemm": gemm, "isa": gemm_isa,
                "decode": decode_isa, "blocks": decode_blocks, "split": decode_split}
    for name in args.only.split(","):
        if name not in sections:
            print(f"error: --only takes {', '.join(sections)}; got {name!r}", file=sys.stderr)
            return 2
        sections[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
